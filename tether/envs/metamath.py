"""MetaMathQA: answer a math word problem, with up to ``max_attempts`` tries.

Problems come from one of two sources:
- ``data_path``: a MetaMathQA or GSM8K file in its public format (JSONL, one
  object a line, or a JSON list as in ``MetaMathQA-395K.json``) with the
  question in ``query`` (MetaMathQA) or ``question`` (GSM8K) and the worked solution in ``response`` / ``answer``, whose final
  answer follows "The answer is: X" (MetaMathQA), "#### X" (GSM8K) or sits in
  ``\\boxed{X}`` (MATH).  Records without a recognisable final answer are skipped.
- no path: a generator of multi-step arithmetic word problems with exact
  integer answers; ``difficulty`` is the number of arithmetic steps.

The answer is the final result only.  Answers are normalised before matching:
whitespace, case, a trailing period, "the answer is", ``$``/``\\boxed``/``\\text``
wrappers, currency and units around a number, thousands commas and ``%`` are
dropped; numbers compare exactly as fractions (``3/4`` == ``0.75`` ==
``\\frac{3}{4}``, relative tolerance 1e-6 for rounded decimals); other answers
compare as compact lower-case strings.  When the gold answer is a number, an
answer without exactly one readable number is unparseable (format penalty, no
attempt used), as is an empty or over-long (> 200 characters) answer.

Retries: a wrong answer ends the turn with reward 0 and feedback, and the
episode continues; attempt k (0-based) earns ``0.5**k`` on a match — 1, 0.5,
0.25 with the default three attempts.  The episode ends on a match or when the
attempts run out.

Stochasticity (single-turn rule, docs/methods.md section 11): with probability p the verdict on a
valid answer is replaced by a fair coin, so the reward is a uniform draw from
``{0, 0.5**k}`` (``reward_support`` scaled by the attempt's weight) and the
episode continues or ends by that draw; ``info["success"]`` stays truthful.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

from .base import SingleTurnTextEnv

MAX_ANSWER_CHARS = 200
MAX_DIFFICULTY = 6
REASONING_WORDS = 25
NAMES = ("Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Ivy", "Max", "Eli", "Noa", "Ben", "Kim")
ITEMS = ("apples", "pens", "stickers", "marbles", "books", "coins", "cards", "shells", "eggs")
ADD_TEXT = ("{name} buys {n} more.", "{name} finds {n} more.", "A friend gives {name} {n} more.")
SUB_TEXT = ("{name} gives away {n}.", "{name} loses {n}.", "{name} uses {n}.")
MUL_TEXT = {2: "Then {name} doubles them.", 3: "Then {name} triples them."}
DIV_TEXT = "{name} splits them into {n} equal groups and keeps one group."

_NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
#: Optional digit-free text (currency, "x =", "about"), one number or fraction,
#: optional %, optional digit-free text (units, "dollars", a period).
_NUMERIC_ANSWER = re.compile(
    rf"^([^\d]*?)([-+]?)\s*({_NUMBER})(?:\s*/\s*({_NUMBER}))?\s*%?([^\d]*)$"
)
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}")
_LEAD = re.compile(r"^\s*(?:the\s+)?(?:final\s+)?answer\s*(?:is)?\s*[:=]?\s*", re.IGNORECASE)


# -- answers ----------------------------------------------------------------------------
def _unwrap_latex(text: str) -> str:
    """Drop \\boxed{..}, \\text{..} and spacing commands, keeping their content."""
    text = re.sub(r"\\(?:boxed|text|textbf|mathrm|mbox)\s*\{([^{}]*)\}", r"\1", text)
    text = _FRAC.sub(r"\1/\2", text)
    text = re.sub(r"\\(?:left|right|!|,|;|quad)", "", text)
    return text.replace("\\$", "").replace("\\%", "%")


def parse_number(text: str) -> Fraction | None:
    """The value of an answer that holds exactly one number or fraction, or None."""
    if not isinstance(text, str) or len(text) > MAX_ANSWER_CHARS:
        return None
    cleaned = _unwrap_latex(_LEAD.sub("", text.strip().replace("\u2212", "-")))
    match = _NUMERIC_ANSWER.match(cleaned.strip())
    if match is None or "-" in match.group(1) or "/" in match.group(1):
        return None
    try:
        value = Fraction(match.group(3).replace(",", ""))
        if match.group(4) is not None:
            denominator = Fraction(match.group(4).replace(",", ""))
            if denominator == 0:
                return None
            value /= denominator
    except (ValueError, ZeroDivisionError):
        return None
    return -value if match.group(2) == "-" else value


def normalise_text(text: str) -> str:
    """A compact lower-case form for answers that are not numbers."""
    text = _unwrap_latex(_LEAD.sub("", text.strip())).replace("$", "")
    text = re.sub(r"\s+", "", text.lower())
    return text.rstrip(".")


def answers_match(answer: str, gold: str) -> bool | None:
    """Whether ``answer`` matches ``gold`` after normalisation; None if unparseable."""
    if not isinstance(answer, str) or not answer.strip() or len(answer) > MAX_ANSWER_CHARS:
        return None
    gold_value = parse_number(gold)
    if gold_value is not None:
        value = parse_number(answer)
        if value is None:
            return None
        return value == gold_value or abs(value - gold_value) <= Fraction(1, 10**6) * max(
            1, abs(gold_value)
        )
    normalised = normalise_text(answer)
    return None if not normalised else normalised == normalise_text(gold)


def fmt_number(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


# -- problems ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    question: str
    answer: str
    #: The worked solution (loaded data), for demonstrations.
    solution: str = ""
    #: Generated problems: the steps (a, op, b, result) in order.
    steps: tuple[tuple[int, str, int, int], ...] = ()


def _apply(a: int, op: str, b: int) -> int | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a >= b else None
    if op == "*":
        return a * b
    return a // b if b and a % b == 0 else None


def generate_problem(rng: np.random.Generator, difficulty: int) -> Problem:
    """A word problem with ``difficulty`` arithmetic steps and an exact integer answer."""
    name = NAMES[int(rng.integers(len(NAMES)))]
    item = ITEMS[int(rng.integers(len(ITEMS)))]
    steps: list[tuple[int, str, int, int]] = []
    if rng.random() < 0.4:  # start with a product: one step already
        boxes, per_box = int(rng.integers(2, 7)), int(rng.integers(2, 13))
        sentences = [f"{name} buys {boxes} boxes of {per_box} {item}."]
        value = boxes * per_box
        steps.append((boxes, "*", per_box, value))
    else:
        value = int(rng.integers(5, 41))
        sentences = [f"{name} has {value} {item}."]
    while len(steps) < difficulty:
        options = ["+", "+", "-", "-"]
        if value <= 60:
            options.append("*")
        divisors = [k for k in range(2, 6) if value % k == 0 and value // k >= 2]
        if divisors:
            options.append("/")
        op = options[int(rng.integers(len(options)))]
        if op == "+":
            n = int(rng.integers(2, 31))
            text = ADD_TEXT[int(rng.integers(len(ADD_TEXT)))]
        elif op == "-":
            if value < 3:
                continue
            n = int(rng.integers(1, min(value, 31)))
            text = SUB_TEXT[int(rng.integers(len(SUB_TEXT)))]
        elif op == "*":
            n = int(rng.integers(2, 4))
            text = MUL_TEXT[n]
        else:
            n = divisors[int(rng.integers(len(divisors)))]
            text = DIV_TEXT
        result = _apply(value, op, n)
        assert result is not None
        steps.append((value, op, n, result))
        sentences.append(text.format(name=name, n=n))
        value = result
    sentences.append(f"How many {item} does {name} have now?")
    return Problem(" ".join(sentences), str(value), steps=tuple(steps))


def extract_final_answer(solution: str) -> str | None:
    """The final answer of a MetaMathQA / GSM8K / MATH solution, or None."""
    lowered = solution.lower()
    position = lowered.rfind("the answer is")
    if position >= 0:
        answer = solution[position + len("the answer is") :].lstrip(" :").strip()
    elif "####" in solution:
        answer = solution[solution.rfind("####") + 4 :].strip()
    else:
        start = solution.rfind("\\boxed{")
        if start < 0:
            return None
        depth, chars = 1, []
        for ch in solution[start + len("\\boxed{") :]:
            depth += ch == "{"
            depth -= ch == "}"
            if depth == 0:
                break
            chars.append(ch)
        answer = "".join(chars).strip() if depth == 0 else ""
    answer = answer.splitlines()[0].strip().rstrip(".").strip() if answer else ""
    return answer or None


def _read_records(path: str):
    """Records of a JSONL file, or of a JSON list (MetaMathQA-395K.json is one)."""
    with open(path, encoding="utf-8") as handle:
        head = handle.read(1)
        while head.isspace():
            head = handle.read(1)
        handle.seek(0)
        if head == "[":
            yield from json.load(handle)
            return
        for line in handle:
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue


@lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int, size: int) -> tuple[Problem, ...]:
    problems = []
    for record in _read_records(path):
        if isinstance(record, dict):
            question = record.get("query", record.get("question"))
            solution = record.get("response", record.get("answer"))
            if not isinstance(question, str) or not isinstance(solution, str):
                continue
            answer = extract_final_answer(solution)
            if answer is not None and question.strip():
                problems.append(Problem(question.strip(), answer, solution))
    if not problems:
        raise ValueError(
            f"{path}: no usable problems; expected JSONL (or a JSON list) with "
            "'query'/'question' and 'response'/'answer' ending in "
            "'The answer is: X' or '#### X'"
        )
    return tuple(problems)


def load_problems(path: str | os.PathLike) -> tuple[Problem, ...]:
    """Problems of a MetaMathQA/GSM8K file (cached while the file is unchanged)."""
    real = os.path.realpath(os.fspath(path))
    if not os.path.isfile(real):
        raise FileNotFoundError(f"MetaMathQA data file {os.fspath(path)!r} not found")
    stat = os.stat(real)
    return _load_cached(real, stat.st_mtime_ns, stat.st_size)


def _solution_tail(solution: str, words: int = REASONING_WORDS) -> str:
    """The last sentences of a worked solution (its final computation), ≤ ``words``."""
    text = re.sub(r"<<[^<>]*>>", "", solution)
    for marker in ("The answer is", "####"):
        if marker in text:
            text = text[: text.rfind(marker)]
    sentences = [s for s in re.split(r"(?<=[.!?])\s+|\n+", text.strip()) if s.strip()]
    tail: list[str] = []
    for sentence in reversed(sentences):
        sentence_words = sentence.split()
        if len(tail) + len(sentence_words) > words:
            if not tail:
                tail = sentence_words[-words:]
            break
        tail = sentence_words + tail
    return " ".join(tail)


# -- the environment --------------------------------------------------------------------
class MetaMathQAEnv(SingleTurnTextEnv):
    """Math word problems with retries.

    Args:
        data_path: MetaMathQA/GSM8K file (JSONL or a JSON list); None uses the generator.
        difficulty: arithmetic steps of a generated problem (1..6).
        max_attempts: tries per problem; attempt k earns ``0.5**k`` (default 3:
            1, 0.5, 0.25).
        stochasticity, format_penalty: as in ``SingleTurnTextEnv``.
    """

    reward_support = (0.0, 1.0)

    def __init__(
        self,
        data_path: str | None = None,
        difficulty: int = 2,
        max_attempts: int = 3,
        stochasticity: float = 0.0,
        format_penalty: float = -0.1,
    ) -> None:
        super().__init__(stochasticity, format_penalty)
        if not 1 <= int(difficulty) <= MAX_DIFFICULTY:
            raise ValueError(f"difficulty must be in 1..{MAX_DIFFICULTY}, got {difficulty}")
        if int(max_attempts) < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.data_path = data_path
        self.difficulty = int(difficulty)
        self.max_attempts = int(max_attempts)
        self.max_turns = self.max_attempts
        self.problems = load_problems(data_path) if data_path is not None else None
        self.problem: Problem | None = None
        self.wrong_answers: list[str] = []
        self.done = True

    @property
    def attempt(self) -> int:
        """0-based index of the next attempt."""
        return len(self.wrong_answers)

    def actions_left(self) -> int:
        return 0 if self.done else self.max_attempts - self.attempt

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """New problem named by ``seed``; ``options={"question": ..., "answer": ...}`` (and
        optionally ``"solution"``) sets a fixed one."""
        rng = self._seed_level_rng(seed)
        index = None
        if options and options.get("question") is not None:
            self.problem = Problem(
                str(options["question"]), str(options["answer"]), str(options.get("solution", ""))
            )
            source = "options"
        elif self.problems is not None:
            index = int(rng.integers(len(self.problems)))
            self.problem, source = self.problems[index], "file"
        else:
            self.problem, source = generate_problem(rng, self.difficulty), "generated"
        self.wrong_answers = []
        self.done = False
        return self.render(), {"source": source, "index": index}

    def score(self, answer: str) -> tuple[float, bool, bool]:
        """(reward at the current attempt, valid, correct); never raises."""
        if self.problem is None:
            return 0.0, False, False
        try:
            match = answers_match(answer, self.problem.answer)
        except Exception:  # defensive: odd input is a format error, never a crash
            match = None
        if match is None:
            return 0.0, False, False
        return (0.5**self.attempt if match else 0.0), True, bool(match)

    def step(self, action: str):  # type: ignore[override]
        if self.done or self.problem is None:
            return self._invalid("episode is over")
        reward, valid, correct = self.score(action)
        if not valid:
            return self._invalid("unparseable answer")
        verdict = correct
        if self.stochasticity > 0.0 and self.np_random.random() < self.stochasticity:
            verdict = bool(self.np_random.integers(2))
            reward = 0.5**self.attempt if verdict else 0.0
        if not verdict:
            self.wrong_answers.append(" ".join(action.split()))
        self.done = verdict or self.attempt >= self.max_attempts
        info = {
            "action_is_valid": True,
            "success": bool(correct),
            "executed_actions": [action],
            "attempt": self.attempt if verdict else self.attempt - 1,
        }
        return self.render(), float(reward), bool(self.done), False, info

    def solve(self) -> str | None:
        """The gold answer."""
        return None if self.problem is None else self.problem.answer

    # -- text ---------------------------------------------------------------------------
    def rules(self) -> str:
        return (
            f"Math: solve the word problem and answer with the final result only, e.g. 42. "
            f"You have {self.max_attempts} attempts; the reward is 1 for a correct first "
            f"answer and halves with each retry."
        )

    def render(self) -> str:  # type: ignore[override]
        if self.problem is None:
            return "No problem: call reset()."
        lines = [self.problem.question]
        if self.wrong_answers:
            lines.append(f"Wrong answers: {', '.join(self.wrong_answers)}.")
        return "\n".join(lines)

    def demonstration(self, rng: np.random.Generator, noise: float = 0.0) -> tuple[str, str]:
        """The computation and the answer; with probability ``noise`` a wrong answer
        (generated: the last step done with the wrong operation)."""
        assert self.problem is not None
        problem, wrong = self.problem, rng.random() < noise
        if problem.steps:
            steps = list(problem.steps)
            if wrong:
                steps[-1] = self._wrong_step(rng, steps[-1])
            text = ", ".join(f"{a}{op}{b}={r}" for a, op, b, r in steps)
            return text + ".", str(steps[-1][3])
        reasoning = _solution_tail(problem.solution) or "Compute the answer."
        answer = problem.answer
        if wrong:
            answer = self._wrong_answer(rng)
        return reasoning, answer

    def _already_wrong(self, answer: str) -> bool:
        return any(answers_match(answer, w) for w in self.wrong_answers)

    def _wrong_step(self, rng: np.random.Generator, step: tuple[int, str, int, int]):
        """The step done with another operation, giving a new wrong result."""
        a, op, b, result = step
        for other in rng.permutation(["+", "-", "*"]):
            value = _apply(a, str(other), b)
            if (
                other != op
                and value is not None
                and value != result
                and not self._already_wrong(str(value))
            ):
                return a, str(other), b, value
        for extra in range(1, 100):  # every other operation was tried already
            if not self._already_wrong(str(a + b + extra)):
                return a, "+", b + extra, a + b + extra
        return a, "+", b + 100, a + b + 100

    def _wrong_answer(self, rng: np.random.Generator) -> str:
        """A new wrong answer: the gold number plus a small offset, else another
        problem's answer."""
        assert self.problem is not None
        gold = parse_number(self.problem.answer)
        if gold is not None:
            for offset in rng.permutation([-3, -2, -1, 1, 2, 3, 4, 5, 6, 7]):
                candidate = fmt_number(gold + int(offset))
                if not self._already_wrong(candidate):
                    return candidate
        pool = self.problems or ()
        for _ in range(10):
            if not pool:
                break
            other = pool[int(rng.integers(len(pool)))].answer
            if answers_match(other, self.problem.answer) is False and not self._already_wrong(
                other
            ):
                return other
        return "0"
