"""What a first turn's reasoning states about its input, checked against the true state.

The MI proxies say whether reasoning *depends* on the input; these checks say whether
what it states about the input is *right* (docs/methods.md, section 2, "Reading
accuracy").  Each env whose state is known and whose demonstrations name it has a
checker: it parses the clause its warm start writes (``demonstration``) and compares it
with the env as reset for the level, before any step.

- FrozenLake: "At (r,c), goal (r,c). Right to (r,c) is safe, then ..." (optionally
  after the restated map rows, and with ``weigh`` the moves toward the goal weighed
  first: "... goal (r,c). Down to (r,c) is a hole; Right to (r,c) is safe. So Right ...");
- Sokoban: "At (r,c), box(es) (r,c),..., target(s) (r,c),.... Up to (r,c), ...";
- Countdown: "Target T from a, b, c: ...".

Other envs have no checker (``reading_checks`` returns None: "not defined").  Any text,
however broken (empty, unterminated, adversarial), gives checks, never an error: what
is not stated, or not parseable, is not read right.

This module imports neither torch nor Ray.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

from .countdown import CountdownEnv
from .frozenlake import MOVES, FrozenLakeEnv, move
from .sokoban import SokobanEnv

# Numbers are bounded to a few digits, so an adversarial reply of thousands of digits
# never reaches int() (which refuses more than 4,300 digits).
_N = r"\d{1,6}"
_POS = rf"\(({_N}),({_N})\)"

FROZENLAKE_POSITIONS = re.compile(rf"At {_POS}, goal {_POS}")
FROZENLAKE_CLAUSE = re.compile(r"(Left|Down|Right|Up) (?:to|hits)")
FROZENLAKE_FIRST_CLAUSE = re.compile(
    rf"(Left|Down|Right|Up) to {_POS} (is a hole|is the goal|is safe)"
)
SOKOBAN_POSITIONS = re.compile(
    rf"At {_POS}, box(?:es)? ((?:\({_N},{_N}\),?)+), targets? ((?:\({_N},{_N}\),?)+)"
)
COUNTDOWN_HEAD = re.compile(rf"Target ({_N}) from ((?:{_N}, )*{_N}):")
_PAIR = re.compile(rf"\(({_N}),({_N})\)")


def _positions(text: str) -> list[tuple[int, int]]:
    return [(int(r), int(c)) for r, c in _PAIR.findall(text)]


def frozenlake_checks(env: FrozenLakeEnv, reasoning: str, answer: str) -> dict[str, bool]:
    """The reading checks of one FrozenLake first turn (``benchmarks/reading_accuracy.py``
    reads them too):

    - ``map_exact``: the reasoning opens with the observed map rows (warm starts with
      ``restate: true`` are taught to copy them);
    - ``player_right`` / ``goal_right``: "At (r,c), goal (r,c)" names the true positions;
    - ``first_move_optimal``: the answer's first move is the first move of a shortest path;
    - ``answer_follows_reasoning``: the answer's moves are the moves the reasoning names
      (after its last "So", when it weighs the moves first);
    - ``first_clause_true``: the first clause (a weighed one, if any) names the cell its
      move leads to and says truly whether it is a hole, the goal or safe;
    - ``first_move_into_hole``: the answer's first move steps into a hole.
    """
    grid = "\n".join(env.map_rows()) if env.show_map else ""
    found = FROZENLAKE_POSITIONS.search(reasoning)
    named = [int(x) for x in found.groups()] if found else None
    moves = [m.strip() for m in answer.split("||") if m.strip()]
    plan = env.solve() or []
    clause = FROZENLAKE_FIRST_CLAUSE.search(reasoning)
    cell = (int(clause[2]), int(clause[3])) if clause else None
    truth = "is a hole" if cell in env.holes else "is the goal" if cell == env.goal else "is safe"
    first = move(env.board_size, env.player, moves[0]) if moves and moves[0] in MOVES else None
    return {
        "map_exact": bool(grid) and reasoning.split("\nAt ")[0].strip() == grid,
        "player_right": named is not None and tuple(named[:2]) == env.player,
        "goal_right": named is not None and tuple(named[2:]) == env.goal,
        "first_move_optimal": bool(moves) and bool(plan) and moves[0] == plan[0],
        "answer_follows_reasoning": bool(moves)
        and FROZENLAKE_CLAUSE.findall(reasoning.rsplit(". So ", 1)[-1]) == moves,
        "first_clause_true": clause is not None
        and cell == move(env.board_size, env.player, clause[1])
        and clause[4] == truth,
        "first_move_into_hole": first in env.holes,
    }


def sokoban_checks(env: SokobanEnv, reasoning: str, answer: str) -> dict[str, bool]:
    """``player_right``, ``boxes_right``, ``targets_right``: "At (r,c), box(es) ...,
    target(s) ..." names the true player and exactly the true boxes and targets."""
    found = SOKOBAN_POSITIONS.search(reasoning)
    if found is None:
        return {"player_right": False, "boxes_right": False, "targets_right": False}
    player = (int(found[1]), int(found[2]))
    return {
        "player_right": player == env.player,
        "boxes_right": Counter(_positions(found[3])) == Counter(env.boxes),
        "targets_right": Counter(_positions(found[4])) == Counter(env.targets),
    }


def countdown_checks(env: CountdownEnv, reasoning: str, answer: str) -> dict[str, bool]:
    """``target_right``, ``numbers_right``: "Target T from a, b, c:" names the true target
    and exactly the given numbers (as a multiset: their order is free)."""
    found = COUNTDOWN_HEAD.search(reasoning)
    if found is None:
        return {"target_right": False, "numbers_right": False}
    numbers = [int(n) for n in found[2].split(", ")]
    return {
        "target_right": int(found[1]) == env.target,
        "numbers_right": Counter(numbers) == Counter(env.numbers),
    }


#: env class -> (its checker, the checks that are facts of the input: all of them right
#: is a correct reading, ``grounding/reading_acc``)
READERS: dict[type, tuple[Callable[..., dict[str, bool]], tuple[str, ...]]] = {
    FrozenLakeEnv: (frozenlake_checks, ("player_right", "goal_right")),
    SokobanEnv: (sokoban_checks, ("player_right", "boxes_right", "targets_right")),
    CountdownEnv: (countdown_checks, ("target_right", "numbers_right")),
}


def reading_defined(env) -> bool:
    return type(env) in READERS


def reading_checks(env, reasoning: str | None, answer: str | None) -> dict[str, bool] | None:
    """The checks of one first turn against ``env`` as reset for its level (not stepped),
    with ``reading`` (every fact of the input right); None when the env has no checker."""
    reader = READERS.get(type(env))
    if reader is None:
        return None
    checker, facts = reader
    checks = checker(env, str(reasoning or ""), str(answer or ""))
    return {**checks, "reading": all(checks[f] for f in facts)}
