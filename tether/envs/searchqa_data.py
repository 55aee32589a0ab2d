"""SearchQA's data: the BM25-indexed corpus, questions, the fictional knowledge base
and the HotpotQA-style loaders (see ``tether.envs.searchqa`` for the formats).

This module imports neither torch nor Ray.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN

TOKEN_PATTERN = re.compile(r"(?u)\b\w\w+\b")
_STOPWORDS = frozenset(STOPWORDS_EN)


# -- corpus and BM25 ---------------------------------------------------------------------
class Corpus:
    """Documents (title, text) with a BM25 index over "title text"."""

    def __init__(self, titles: list[str], texts: list[str]) -> None:
        if not titles:
            raise ValueError("the SearchQA corpus is empty")
        self.titles, self.texts = titles, texts
        tokens = [self.tokenize(f"{t} {x}") or [""] for t, x in zip(titles, texts)]
        self.retriever = bm25s.BM25()
        self.retriever.index(tokens, show_progress=False)
        self.vocab: dict[str, int] = self.retriever.vocab_dict
        self.by_title = {t.lower(): i for i, t in reversed(list(enumerate(titles)))}

    @staticmethod
    def tokenize(text: str) -> list[str]:
        return [w for w in TOKEN_PATTERN.findall(text.lower()) if w not in _STOPWORDS]

    def search(self, query: str, k: int) -> list[int]:
        """Indices of the top ``k`` documents with a positive score, best first
        (ties broken by corpus order, so results are deterministic)."""
        ids = sorted({self.vocab[w] for w in self.tokenize(query) if w in self.vocab})
        if not ids:
            return []
        scores = self.retriever.get_scores_from_ids(ids)
        k = min(k, len(scores))
        if k < len(scores):
            candidates = np.argpartition(-scores, k - 1)[:k]
        else:
            candidates = np.arange(len(scores))
        # Widen to every document tied with the k-th score, then order stably.
        cutoff = scores[candidates].min()
        candidates = np.flatnonzero(scores >= cutoff)
        order = candidates[np.lexsort((candidates, -scores[candidates]))]
        return [int(i) for i in order[:k] if scores[i] > 0]

    def passage(self, index: int, words: int) -> str:
        text = self.texts[index].split()
        cut = " ".join(text[:words]) + (" ..." if len(text) > words else "")
        return f"{self.titles[index]}: {cut}"


_CORPORA: dict[tuple, Corpus] = {}


def shared_corpus(key: tuple, build: Callable[[], tuple[list[str], list[str]]]) -> Corpus:
    """The corpus for ``key``, indexed on first use and then shared."""
    if key not in _CORPORA:
        _CORPORA[key] = Corpus(*build())
    return _CORPORA[key]


# -- questions ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Question:
    text: str
    answer: str
    #: The documents to read, in order: (title, fact learned there; "" if unknown).
    hops: tuple[tuple[str, str], ...] = ()
    #: Plausible wrong answers (for noisy demonstrations).
    distractors: tuple[str, ...] = ()


JOBS = (
    "painter",
    "doctor",
    "pilot",
    "chef",
    "teacher",
    "baker",
    "farmer",
    "writer",
    "singer",
    "lawyer",
)
COMPANY_KINDS = ("Labs", "Works", "Foundry", "Mills", "Group", "Motors")
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"


@dataclass(frozen=True)
class KnowledgeBase:
    """Fictional entities; every relation lives in one entity's document."""

    people: tuple[tuple[str, str, int, int], ...]  # name, job, city, company
    companies: tuple[tuple[str, int, int], ...]  # name, city, year founded
    cities: tuple[tuple[str, int], ...]  # name, country
    countries: tuple[tuple[str, int], ...]  # name, capital city

    def documents(self) -> tuple[list[str], list[str]]:
        titles, texts = [], []
        for name, job, city, company in self.people:
            titles.append(name)
            texts.append(
                f"{name} is a {job} born in {self.cities[city][0]}. {name} works at "
                f"{self.companies[company][0]}."
            )
        for name, city, year in self.companies:
            titles.append(name)
            texts.append(
                f"{name} is a company based in {self.cities[city][0]}. {name} was "
                f"founded in {year}."
            )
        for name, country in self.cities:
            titles.append(name)
            texts.append(f"{name} is a city in {self.countries[country][0]}.")
        for name, capital in self.countries:
            titles.append(name)
            texts.append(
                f"{name} is a country. The capital of {name} is {self.cities[capital][0]}."
            )
        return titles, texts

    # One fact per relation, as (document title, sentence learned there).
    def _born(self, p: int) -> tuple[str, str]:
        name, _, city, _ = self.people[p]
        return name, f"{name} was born in {self.cities[city][0]}"

    def _works(self, p: int) -> tuple[str, str]:
        name, _, _, company = self.people[p]
        return name, f"{name} works at {self.companies[company][0]}"

    def _based(self, c: int) -> tuple[str, str]:
        name, city, _ = self.companies[c]
        return name, f"{name} is based in {self.cities[city][0]}"

    def _founded(self, c: int) -> tuple[str, str]:
        name, _, year = self.companies[c]
        return name, f"{name} was founded in {year}"

    def _in_country(self, ci: int) -> tuple[str, str]:
        name, country = self.cities[ci]
        return name, f"{name} is in {self.countries[country][0]}"

    def question(self, rng: np.random.Generator, two_hop_fraction: float) -> Question:
        """A one- or two-hop question about a random entity."""
        p, c = int(rng.integers(len(self.people))), int(rng.integers(len(self.companies)))
        ci, co = int(rng.integers(len(self.cities))), int(rng.integers(len(self.countries)))
        person, job, p_city, p_company = self.people[p]
        company, c_city, year = self.companies[c]
        city_of = lambda i: self.cities[i][0]  # noqa: E731
        country_of_city = lambda i: self.countries[self.cities[i][1]][0]  # noqa: E731
        cities = [x[0] for x in self.cities]
        companies = [x[0] for x in self.companies]
        countries = [x[0] for x in self.countries]
        years = [str(x[2]) for x in self.companies]
        if rng.random() < two_hop_fraction:
            options = [
                (
                    f"In which country was {person} born?",
                    country_of_city(p_city),
                    (self._born(p), self._in_country(p_city)),
                    countries,
                ),
                (
                    f"In which city is the company of {person} based?",
                    city_of(self.companies[p_company][1]),
                    (self._works(p), self._based(p_company)),
                    cities,
                ),
                (
                    f"In which year was the company of {person} founded?",
                    str(self.companies[p_company][2]),
                    (self._works(p), self._founded(p_company)),
                    years,
                ),
                (
                    f"In which country is {company} based?",
                    country_of_city(c_city),
                    (self._based(c), self._in_country(c_city)),
                    countries,
                ),
            ]
        else:
            country, capital = self.countries[co]
            options = [
                (f"Where was {person} born?", city_of(p_city), (self._born(p),), cities),
                (
                    f"Which company does {person} work at?",
                    self.companies[p_company][0],
                    (self._works(p),),
                    companies,
                ),
                (
                    f"What is the job of {person}?",
                    job,
                    ((person, f"{person} is a {job}"),),
                    list(JOBS),
                ),
                (f"In which city is {company} based?", city_of(c_city), (self._based(c),), cities),
                (f"In which year was {company} founded?", str(year), (self._founded(c),), years),
                (
                    f"Which country is {city_of(ci)} in?",
                    country_of_city(ci),
                    (self._in_country(ci),),
                    countries,
                ),
                (
                    f"What is the capital of {country}?",
                    city_of(capital),
                    ((country, f"The capital of {country} is {city_of(capital)}"),),
                    cities,
                ),
            ]
        text, answer, hops, pool = options[int(rng.integers(len(options)))]
        pool = sorted({x for x in pool if x != answer})
        picks = rng.choice(len(pool), size=min(8, len(pool)), replace=False) if pool else []
        distractors = tuple(pool[int(i)] for i in picks)
        return Question(text, answer, tuple(hops), distractors)


def _unique_words(rng: np.random.Generator, n: int) -> list[str]:
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < n:
        syllables = 2
        word = "".join(
            _CONSONANTS[int(rng.integers(len(_CONSONANTS)))]
            + _VOWELS[int(rng.integers(len(_VOWELS)))]
            for _ in range(syllables)
        )
        if rng.random() < 0.5:
            word += _CONSONANTS[int(rng.integers(len(_CONSONANTS)))]
        if word not in seen and word not in _STOPWORDS:
            seen.add(word)
            words.append(word.capitalize())
    return words


@lru_cache(maxsize=8)
def generate_knowledge_base(seed: int, num_people: int) -> KnowledgeBase:
    """A deterministic fictional world of ``num_people`` people and their places."""
    rng = np.random.default_rng([int(seed), 0x5EA4C4])
    n_countries, n_cities = max(2, num_people // 40), max(3, num_people // 8)
    n_companies = max(2, num_people // 5)
    words = iter(_unique_words(rng, n_countries + n_cities + n_companies + 2 * num_people))
    city_country = [
        i % n_countries if i < n_countries else int(rng.integers(n_countries))
        for i in range(n_cities)
    ]
    cities = tuple((next(words), country) for country in city_country)
    countries = tuple((next(words), i) for i in range(n_countries))  # capital: city i
    companies = tuple(
        (
            f"{next(words)} {COMPANY_KINDS[int(rng.integers(len(COMPANY_KINDS)))]}",
            int(rng.integers(n_cities)),
            int(rng.integers(1900, 2021)),
        )
        for _ in range(n_companies)
    )
    people = tuple(
        (
            f"{next(words)} {next(words)}",
            JOBS[int(rng.integers(len(JOBS)))],
            int(rng.integers(n_cities)),
            int(rng.integers(n_companies)),
        )
        for _ in range(num_people)
    )
    return KnowledgeBase(people, companies, cities, countries)


# -- HotpotQA-style files ----------------------------------------------------------------
def _read_records(path: str) -> list[dict]:
    """The objects of a JSON list or a JSONL file."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if text.lstrip().startswith("["):
        records = json.loads(text)
    else:
        records = []
        for line in filter(str.strip, text.splitlines()):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a broken line is skipped, not fatal
    return [r for r in records if isinstance(r, dict)]


def _paragraphs(context: Any) -> list[tuple[str, str]]:
    """HotpotQA ``context`` as (title, text) pairs, in either public layout."""
    if isinstance(context, dict):
        context = list(zip(context.get("title", []), context.get("sentences", [])))
    out = []
    for item in context or []:
        if isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str):
            sentences = item[1]
            if isinstance(sentences, list):
                text = " ".join(str(s).strip() for s in sentences)
            else:
                text = str(sentences)
            out.append((item[0], text))
    return out


def _supporting_titles(facts: Any) -> list[str]:
    if isinstance(facts, dict):
        facts = [[t] for t in facts.get("title", [])]
    titles: list[str] = []
    for fact in facts or []:
        title = fact[0] if isinstance(fact, (list, tuple)) and fact else None
        if isinstance(title, str) and title not in titles:
            titles.append(title)
    return titles


def file_key(path: str | os.PathLike) -> tuple[str, int, int]:
    """(real path, mtime, size): a file's identity for the caches."""
    real = os.path.realpath(os.fspath(path))
    if not os.path.isfile(real):
        raise FileNotFoundError(f"SearchQA data file {os.fspath(path)!r} not found")
    stat = os.stat(real)
    return real, stat.st_mtime_ns, stat.st_size


@lru_cache(maxsize=8)
def load_questions(
    key: tuple[str, int, int],
) -> tuple[tuple[Question, ...], tuple[tuple[str, str], ...]]:
    """Questions and the context paragraphs of a HotpotQA-style file (by ``file_key``)."""
    questions, paragraphs = [], []
    for r in _read_records(key[0]):
        paragraphs.extend(_paragraphs(r.get("context")))
        question, answer = r.get("question"), r.get("answer")
        if isinstance(question, str) and isinstance(answer, str) and answer.strip():
            hops = tuple((t, "") for t in _supporting_titles(r.get("supporting_facts")))
            questions.append(Question(question.strip(), answer.strip(), hops))
    if not questions:
        raise ValueError(f"{key[0]}: no questions with 'question' and 'answer' fields")
    answers = sorted({q.answer for q in questions})
    spread = answers[:: max(1, len(answers) // 50)]  # other questions' answers, for noisy demos
    questions = [
        Question(q.text, q.answer, q.hops, tuple(a for a in spread if a != q.answer))
        for q in questions
    ]
    return tuple(questions), tuple(paragraphs)


def corpus_documents(key: tuple[str, int, int]) -> tuple[list[str], list[str]]:
    """Titles and texts of a corpus file (by ``file_key``) in any supported layout."""
    docs: list[tuple[str, str]] = []
    for r in _read_records(key[0]):
        if "context" in r:
            docs.extend(_paragraphs(r["context"]))
        elif isinstance(r.get("contents"), str):  # Pyserini: '"Title"\ntext'
            title, _, text = r["contents"].partition("\n")
            docs.append((title.strip().strip('"'), text.strip()))
        elif isinstance(r.get("title"), str):
            text = r.get("text", "")
            docs.append((r["title"], " ".join(text) if isinstance(text, list) else str(text)))
    return dedupe_documents(docs)


def dedupe_documents(docs) -> tuple[list[str], list[str]]:
    """Titles and texts of (title, text) pairs, each distinct pair once, in order."""
    seen: set[tuple[str, str]] = set()
    titles, texts = [], []
    for title, text in docs:
        if (title, text) not in seen:
            seen.add((title, text))
            titles.append(title)
            texts.append(text)
    return titles, texts
