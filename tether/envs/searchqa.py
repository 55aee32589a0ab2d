"""SearchQA: answer a question by searching a document corpus with BM25.

Each turn the agent writes one action: ``search[query]`` runs BM25 (bm25s)
over the corpus and the next observation shows the top ``top_k`` passages,
each cut to ``passage_words`` words; ``finish[answer]`` ends the episode.
The paper's setting shows the top 5; the defaults (top 3 x 30 words) keep a five-turn
episode inside the tiny model's 1k-token window — raise them for real models.
The observation holds the question and the latest results (earlier results
stay in the chat context).

Reward on ``finish`` (SQuAD-style normalisation: case, punctuation, articles,
whitespace): 1 on an exact match, else the token F1 if it is at least 0.3, else
0.  Running out of turns (``max_turns``, one action per turn) gives 0 and
truncates the episode.  Text that is not ``search[...]`` / ``finish[...]`` with
some word characters inside (≤ 200 characters) is invalid: format penalty, no
step, no turn used.

Data:
- ``data_path``: HotpotQA-style questions, JSON (a list) or JSONL, with
  ``question``, ``answer`` and optionally ``supporting_facts`` (the titles the
  demonstrations search for) and ``context`` (paragraphs as ``[title,
  sentences]`` pairs, or the Hugging Face ``{"title": [...], "sentences":
  [...]}`` form).  ``corpus_path``: JSON/JSONL documents ``{"title", "text"}``
  (``text`` may be a list of sentences), Pyserini-style ``{"contents"}``, or
  records with a HotpotQA ``context``.  Without ``corpus_path`` the corpus is
  the union of the questions' contexts.
- no path: a knowledge base of fictional people, companies, cities and
  countries generated from ``kb_seed``, one short document per entity, with
  one-hop ("Where was Kelo Vun born?") and two-hop ("In which country was Kelo
  Vun born?") questions.  The names are invented, so only a search can answer.

The BM25 index is built once per corpus and shared by every env on it
(a module-level cache keyed by the corpus's identity), so resets cost nothing.

Stochasticity (multi-turn rule, docs/methods.md section 11): with probability p the executed
action is replaced by a random valid action, defined here as a search for the
title of a uniformly drawn corpus document; the observation shows what ran.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

import numpy as np

from .base import MultiTurnTextEnv
from .searchqa_data import (
    Corpus,
    Question,
    corpus_documents,
    dedupe_documents,
    file_key,
    generate_knowledge_base,
    load_questions,
    shared_corpus,
)

MAX_ARG_CHARS = 200
F1_THRESHOLD = 0.3
_PUNCTUATION = frozenset(string.punctuation)
REASONING_WORDS = 25
ACTION_PATTERN = re.compile(r"^\s*(search|finish)\s*\[(.*)\]\s*$", re.IGNORECASE)
#: An argument holding another action ("search[a] finish[b]") is two actions: invalid.
INNER_ACTION = re.compile(r"\]|\b(search|finish)\s*\[", re.IGNORECASE)


# -- answer scoring (SQuAD style) --------------------------------------------------------
def normalise_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, gold: str) -> float:
    pred, ref = normalise_answer(prediction).split(), normalise_answer(gold).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if not pred or not ref or common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def answer_reward(prediction: str, gold: str) -> tuple[float, bool, float]:
    """(reward, exact match, f1): 1 on exact match, else f1 if ≥ 0.3, else 0."""
    exact = normalise_answer(prediction) == normalise_answer(gold)
    f1 = 1.0 if exact else token_f1(prediction, gold)
    return (1.0 if exact else f1 if f1 >= F1_THRESHOLD else 0.0), exact, f1


def parse_action(text: Any) -> tuple[str, str] | None:
    """``("search" | "finish", argument)`` of a well-formed action, or None."""
    if not isinstance(text, str) or len(text) > MAX_ARG_CHARS + 20:
        return None
    match = ACTION_PATTERN.match(text)
    if match is None:
        return None
    argument = " ".join(match.group(2).split())
    if (
        not argument
        or len(argument) > MAX_ARG_CHARS
        or not re.search(r"\w", argument)
        or INNER_ACTION.search(argument)
    ):
        return None
    return match.group(1).lower(), argument


# -- the environment --------------------------------------------------------------------
class SearchQAEnv(MultiTurnTextEnv):
    """Question answering by BM25 search, one ``search[q]`` / ``finish[a]`` per turn.

    Args:
        data_path: HotpotQA-style questions (JSON or JSONL); None uses the generated
            knowledge base.
        corpus_path: documents to search; None uses the questions' contexts (files) or
            the knowledge base (offline).
        top_k: passages shown per search (RAGEN-2 uses 5; default 3 for the 1k-token model).
        passage_words: each passage's text is cut to this many words.
        num_people: size of the generated knowledge base (people; companies, cities
            and countries scale with it).
        kb_seed: the generated world (questions are drawn per ``reset`` seed).
        two_hop_fraction: share of generated questions that need two searches.
        max_turns: actions per episode (one per turn).
        stochasticity, format_penalty: as in ``MultiTurnTextEnv``.
    """

    max_turns = 5
    max_actions_per_turn = 1
    max_actions = 5
    action_names = ("search", "finish")

    def __init__(
        self,
        data_path: str | None = None,
        corpus_path: str | None = None,
        top_k: int = 3,
        passage_words: int = 30,
        num_people: int = 300,
        kb_seed: int = 0,
        two_hop_fraction: float = 0.5,
        max_turns: int = 5,
        stochasticity: float = 0.0,
        format_penalty: float = -0.1,
    ) -> None:
        if int(max_turns) < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        super().__init__(
            stochasticity,
            format_penalty,
            max_turns=int(max_turns),
            max_actions_per_turn=1,
            max_actions=int(max_turns),
        )
        if int(top_k) < 1 or int(passage_words) < 1:
            raise ValueError("top_k and passage_words must be positive")
        if int(num_people) < 2:
            raise ValueError(f"num_people must be at least 2, got {num_people}")
        if not 0.0 <= float(two_hop_fraction) <= 1.0:
            raise ValueError(f"two_hop_fraction must be in [0, 1], got {two_hop_fraction}")
        self.top_k, self.passage_words = int(top_k), int(passage_words)
        self.two_hop_fraction = float(two_hop_fraction)
        self.kb = None
        self.questions: tuple[Question, ...] | None = None
        if data_path is None:
            self.kb = generate_knowledge_base(int(kb_seed), int(num_people))
            key: tuple = ("kb", int(kb_seed), int(num_people))
            self.corpus: Corpus = shared_corpus(key, self.kb.documents)
        else:
            qkey = file_key(data_path)
            self.questions, paragraphs = load_questions(qkey)
            if corpus_path is not None:
                ckey = file_key(corpus_path)
                self.corpus = shared_corpus(("corpus",) + ckey, lambda: corpus_documents(ckey))
            elif paragraphs:
                self.corpus = shared_corpus(
                    ("context",) + qkey, lambda: dedupe_documents(paragraphs)
                )
            else:
                raise ValueError(f"{data_path}: no 'context' paragraphs; give corpus_path")
        self.question: Question | None = None
        self.last_query: str | None = None
        self.last_results: list[int] = []
        self.seen: set[int] = set()
        self.searched: list[str] = []
        self.final_answer: str | None = None

    # -- episode ------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """New question named by ``seed``; ``options={"question": ..., "answer": ...,
        "hops": [title, ...]}`` sets a fixed one."""
        rng = self._seed_level_rng(seed)
        index = None
        if options and options.get("question") is not None:
            hops = tuple((str(t), "") for t in options.get("hops", ()))
            self.question = Question(str(options["question"]), str(options["answer"]), hops)
        elif self.questions is not None:
            index = int(rng.integers(len(self.questions)))
            self.question = self.questions[index]
        else:
            assert self.kb is not None
            self.question = self.kb.question(rng, self.two_hop_fraction)
        self.last_query, self.last_results = None, []
        self.seen, self.searched, self.final_answer = set(), [], None
        self._start_episode()
        return self.render(), {"index": index, "hops": len(self.question.hops)}

    def parse_actions(self, answer: str) -> list[str] | None:
        parsed = parse_action(answer)
        return None if parsed is None else [f"{parsed[0]}[{parsed[1]}]"]

    def random_action(self) -> str:
        """The stochastic replacement: a search for a random document's title."""
        titles = self.corpus.titles
        return f"search[{titles[int(self.np_random.integers(len(titles)))]}]"

    def step(self, action: str):  # type: ignore[override]
        if self.done or self.actions_left() <= 0 or self.question is None:
            return self._invalid("episode is over")
        names = self.parse_actions(action)
        if names is None:
            return self._invalid("not search[query] or finish[answer]")
        requested = executed = names[0]
        if self.stochasticity > 0.0 and self.np_random.random() < self.stochasticity:
            executed = self.random_action()
        reward, self.done, success = self._apply(executed)
        self.actions_taken += 1
        truncated = (not self.done) and self.actions_left() <= 0
        info = {
            "action_is_valid": True,
            "success": bool(success),
            "executed_actions": [executed],
            "requested_actions": [requested],
        }
        return self.render(), float(reward), bool(self.done), bool(truncated), info

    def _apply(self, action_name: str) -> tuple[float, bool, bool]:
        assert self.question is not None
        kind, _, rest = action_name.partition("[")  # a canonical "kind[argument]"
        argument = rest[:-1]
        if kind == "finish":
            self.final_answer = argument
            reward, exact, _ = answer_reward(argument, self.question.answer)
            return reward, True, exact
        self.last_query = argument
        self.last_results = self.corpus.search(argument, self.top_k)
        self.seen.update(self.last_results)
        self.searched.append(argument.lower())
        return 0.0, False, False

    # -- solver and demonstrations -----------------------------------------------------
    def _pending_hops(self) -> list[tuple[str, str]]:
        """Hops whose document is in the corpus and neither seen nor searched yet."""
        assert self.question is not None
        pending = []
        for title, fact in self.question.hops:
            index = self.corpus.by_title.get(title.lower())
            if index is not None and index not in self.seen and title.lower() not in self.searched:
                pending.append((title, fact))
        return pending

    def solve(self) -> list[str] | None:
        """The remaining plan: a search per unread document, then the answer."""
        if self.question is None or self.done:
            return None
        searches = [f"search[{_argument(title)}]" for title, _ in self._pending_hops()]
        return searches[: max(0, self.actions_left() - 1)] + [
            f"finish[{_argument(self.question.answer)}]"
        ]

    def demonstration(self, rng: np.random.Generator, noise: float = 0.0) -> tuple[str, str]:
        """Search the next unread document of the question's chain, naming what was
        learned; once all are read (or one turn is left), finish with the answer.
        With probability ``noise``: a search for a random title, or a wrong answer."""
        assert self.question is not None
        question, pending = self.question, self._pending_hops()
        wrong = rng.random() < noise
        read = [
            fact
            for title, fact in question.hops
            if fact
            and (title, fact) not in pending
            and self.corpus.by_title.get(title.lower()) in self.seen
        ]
        prefix = f"{read[-1]}. " if read else ""
        if pending and self.actions_left() > 1:
            title = pending[0][0]
            if wrong:
                title = self.corpus.titles[int(rng.integers(len(self.corpus.titles)))]
            return _clip(f"{prefix}I need facts about {title}."), f"search[{_argument(title)}]"
        if wrong:
            pool = question.distractors or ("unknown",)
            guess = pool[int(rng.integers(len(pool)))]
            return f"I guess the answer is {guess}.", f"finish[{_argument(guess)}]"
        if not read and question.hops:
            prefix = f"Read {', '.join(t for t, _ in question.hops)}. "
        return (
            _clip(f"{prefix}The answer is {question.answer}."),
            f"finish[{_argument(question.answer)}]",
        )

    # -- text ---------------------------------------------------------------------------
    def rules(self) -> str:
        return (
            f"SearchQA: answer the question. search[query] shows the top {self.top_k} "
            "passages; finish[answer] gives your answer and ends. One action per turn. "
            "Reward 1 for an exact answer, partial for overlapping words."
        )

    def render(self) -> str:  # type: ignore[override]
        if self.question is None:
            return "No question: call reset()."
        lines = [f"Question: {self.question.text}"]
        if self.final_answer is not None:
            lines.append(f"Final answer: {self.final_answer}")
        elif self.last_query is None:
            lines.append("No search yet.")
        elif not self.last_results:
            lines.append(f"No results for {self.last_query}.")
        else:
            lines.append(f"Results for {self.last_query}:")
            lines += [
                f"{k + 1}. {self.corpus.passage(i, self.passage_words)}"
                for k, i in enumerate(self.last_results)
            ]
        return "\n".join(lines)


def _argument(text: str) -> str:
    """``text`` made safe inside ``search[...]`` / ``finish[...]`` (no brackets, one line,
    bounded); the SQuAD normalisation ignores the swapped punctuation."""
    text = " ".join(text.replace("[", "(").replace("]", ")").split())
    return text[:MAX_ARG_CHARS]


def _clip(text: str, words: int = REASONING_WORDS) -> str:
    """The last ``words`` words (the conclusion matters most)."""
    parts = text.split()
    return text if len(parts) <= words else " ".join(parts[-words:])
