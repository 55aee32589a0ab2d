"""FrozenLake: walk from the start to the goal without falling into a hole.

Maps are generated per seed: each cell is frozen with probability
``frozen_fraction`` (else a hole), the start and goal are placed by ``start``
mode, and the map is redrawn until a breadth-first search finds a path of at
most ``max_actions`` moves.  The same BFS is the optimal solver behind the
warm-start demonstrations.

The classic slippery ice is not built in: the env-wide ``stochasticity`` knob
(docs/methods.md, section 11) replaces an executed action by a uniformly random one, which is
FrozenLake's slip generalised.  Reward +1 on reaching the goal (success, the
episode ends); stepping on a hole ends the episode with 0; every other move 0.
A move off the board leaves the player in place.

Grid symbols: ``P`` player, ``G`` goal, ``H`` hole, ``_`` frozen; a last line names the
player, the goal and the holes by coordinate (as Sokoban lists boxes and targets).  Coordinates
are (row,col), 0-based from the top-left corner.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import MultiTurnTextEnv
from .grid import Pos, backtrack, fmt_pos

MOVES: dict[str, Pos] = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
START_MODES = ("corner", "region", "random")
GENERATION_TRIES = 10_000


def move(size: int, pos: Pos, action: str) -> Pos:
    """Where ``action`` takes the player from ``pos`` (the board edge blocks)."""
    dr, dc = MOVES[action]
    r, c = pos[0] + dr, pos[1] + dc
    return (r, c) if 0 <= r < size and 0 <= c < size else pos


def solve_frozenlake(size: int, holes: frozenset[Pos], start: Pos, goal: Pos) -> list[str] | None:
    """Shortest hole-free move sequence from ``start`` to ``goal`` (BFS), or None."""
    if start == goal:
        return []
    parent: dict[Pos, tuple[Pos, str] | None] = {start: None}
    frontier = deque([start])
    while frontier:
        pos = frontier.popleft()
        for action in MOVES:
            nxt = move(size, pos, action)
            if nxt in parent or nxt in holes:
                continue
            parent[nxt] = (pos, action)
            if nxt == goal:
                return backtrack(parent, nxt)
            frontier.append(nxt)
    return None


class FrozenLakeEnv(MultiTurnTextEnv):
    """Procedurally generated FrozenLake with text observations and text actions.

    Args:
        size: the board is ``size`` x ``size``.
        frozen_fraction: probability that a cell is frozen (safe) rather than a hole.
        start: ``"corner"`` start (0,0), goal (size-1,size-1) as in gymnasium;
            ``"region"`` start anywhere in the top-left quarter, goal anywhere in the
            bottom-right quarter (the default: varied levels, classic shape);
            ``"random"`` start and goal anywhere.
        stochasticity, format_penalty, max_turns, max_actions_per_turn, max_actions:
            as in ``MultiTurnTextEnv``.
        show_map: the observation opens with the map's rows (the default, as in the
            paper); ``False`` keeps only the line that names the player, the goal and
            every hole by coordinate (the same facts: the rows repeat them).  A tiny
            model learns the holes' list far more easily without the rows beside it
            (benchmarks/history/2026-11-26.md).
        show_moves: the observation ends with where each move leads from the player's
            cell ("Moves: Left hits the edge; Down to (2,0) is a hole; ..."): a local
            view, as many gridworlds give, for models too small to look cells up in
            the hole list.
    """

    action_names = ("Left", "Down", "Right", "Up")

    def __init__(
        self,
        size: int = 4,
        frozen_fraction: float = 0.8,
        start: str = "region",
        stochasticity: float = 0.0,
        format_penalty: float = -0.1,
        max_turns: int | None = None,
        max_actions_per_turn: int | None = None,
        max_actions: int | None = None,
        show_map: bool = True,
        show_moves: bool = False,
    ) -> None:
        super().__init__(
            stochasticity, format_penalty, max_turns, max_actions_per_turn, max_actions
        )
        if int(size) < 2:
            raise ValueError(f"size must be at least 2, got {size}")
        if not 0.0 < float(frozen_fraction) <= 1.0:
            raise ValueError(f"frozen_fraction must be in (0, 1], got {frozen_fraction}")
        if start not in START_MODES:
            raise ValueError(f"start must be one of {START_MODES}, got {start!r}")
        if start == "corner" and 2 * (int(size) - 1) > self.max_actions:
            raise ValueError(
                f"a corner-to-corner path on a {size}x{size} board needs more "
                f"than max_actions={self.max_actions} moves"
            )
        self.size = int(size)
        self.frozen_fraction = float(frozen_fraction)
        self.start_mode = start
        for name, value in (("show_map", show_map), ("show_moves", show_moves)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {value!r}")
        self.show_map, self.show_moves = show_map, show_moves
        self.holes: frozenset[Pos] = frozenset()
        self.goal: Pos = (self.size - 1, self.size - 1)
        self.start_pos: Pos = (0, 0)
        self.player: Pos | None = None
        self.board_size = self.size  # of the current map (a loaded grid may differ)

    # -- map generation -----------------------------------------------------------------
    def _pick_start_goal(self, rng: np.random.Generator) -> tuple[Pos, Pos]:
        n = self.size
        if self.start_mode == "corner":
            return (0, 0), (n - 1, n - 1)
        if self.start_mode == "region":
            h = max(1, n // 2)
            start = (int(rng.integers(0, h)), int(rng.integers(0, h)))
            goal = (int(rng.integers(n - h, n)), int(rng.integers(n - h, n)))
            return start, goal
        first, second = rng.choice(n * n, size=2, replace=False)
        return (int(first) // n, int(first) % n), (int(second) // n, int(second) % n)

    def _generate(self, rng: np.random.Generator) -> tuple[frozenset[Pos], Pos, Pos]:
        n = self.size
        for _ in range(GENERATION_TRIES):
            start, goal = self._pick_start_goal(rng)
            hole_mask = rng.random((n, n)) >= self.frozen_fraction
            holes = frozenset(
                (r, c)
                for r in range(n)
                for c in range(n)
                if hole_mask[r, c] and (r, c) not in (start, goal)
            )
            plan = solve_frozenlake(n, holes, start, goal)
            if plan and len(plan) <= self.max_actions:
                return holes, start, goal
        raise RuntimeError(
            f"no FrozenLake map with a path of <= {self.max_actions} moves "
            f"(size={n}, frozen_fraction={self.frozen_fraction})"
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """New map named by ``seed``; ``options={"grid": [...]}`` loads a fixed map
        written in the render symbols (``P`` marks the start)."""
        rng = self._seed_level_rng(seed)
        if options and options.get("grid") is not None:
            self.board_size, self.holes, self.start_pos, self.goal = parse_grid(options["grid"])
        else:
            self.holes, self.start_pos, self.goal = self._generate(rng)
            self.board_size = self.size
        self.player = self.start_pos
        self._start_episode()
        return self._reset_result()

    # -- dynamics -----------------------------------------------------------------------
    def _apply(self, action_name: str) -> tuple[float, bool, bool]:
        assert self.player is not None
        self.player = move(self.board_size, self.player, action_name)
        if self.player in self.holes:
            return 0.0, True, False
        if self.player == self.goal:
            return 1.0, True, True
        return 0.0, False, False

    def solve(self) -> list[str] | None:
        if self.player is None or self.player in self.holes:
            return None
        return solve_frozenlake(self.board_size, self.holes, self.player, self.goal)

    # -- text ---------------------------------------------------------------------------
    def rules(self) -> str:
        return (
            "FrozenLake: walk to the goal G without stepping into a hole H. P player, "
            "_ frozen; positions are (row,col). Moves: Left, Down, Right, Up. "
            "Reward +1 at the goal; a hole ends the episode with 0."
        )

    def render(self) -> str:  # type: ignore[override]
        if self.player is None:
            return "No map: call reset()."
        status = ""
        if self.player in self.holes:
            status = " Fell in a hole."
        elif self.player == self.goal:
            status = " Reached the goal."
        holes = " ".join(fmt_pos(h) for h in sorted(self.holes)) or "none"
        facts = f"Player {fmt_pos(self.player)}. Goal {fmt_pos(self.goal)}. Holes {holes}.{status}"
        if self.show_moves:
            around = "; ".join(self._describe(self.player, a)[1] for a in self.action_names)
            facts += f"\nMoves: {around}."
        return "\n".join([*self.map_rows(), facts] if self.show_map else [facts])

    def map_rows(self) -> list[str]:
        """The map as rows of render symbols (P player, G goal, H hole, _ frozen)."""
        symbol = {self.goal: "G", **{h: "H" for h in self.holes}, self.player: "P"}
        n = self.board_size
        return ["".join(symbol.get((r, c), "_") for c in range(n)) for r in range(n)]

    def toward_goal(self) -> list[str]:
        """The moves that bring the player nearer the goal, in the order Down, Right,
        Up, Left (one or two of them)."""
        assert self.player is not None
        (r, c), (gr, gc) = self.player, self.goal
        toward = {"Down": gr > r, "Right": gc > c, "Up": gr < r, "Left": gc < c}
        return [m for m, near in toward.items() if near]

    def _describe(self, pos: Pos, action: str) -> tuple[Pos, str]:
        nxt = move(self.board_size, pos, action)
        if nxt == pos:
            return nxt, f"{action} hits the edge"
        what = (
            "is a hole" if nxt in self.holes else "is the goal" if nxt == self.goal else "is safe"
        )
        return nxt, f"{action} to {fmt_pos(nxt)} {what}"

    def demonstration(
        self,
        rng: np.random.Generator,
        noise: float = 0.0,
        restate: bool = False,
        weigh: bool = False,
    ) -> tuple[str, str]:
        """Reasoning that names the player and goal and where each chosen move leads,
        then the moves: the optimal plan's next ≤2 moves, or with probability
        ``noise`` as many random moves.  ``restate`` opens the reasoning with the map's
        rows as observed, so the holes it read are in it too, not only two coordinates.
        ``weigh`` first says where each move toward the goal leads, then chooses after
        "So": "At (1,0), goal (3,2). Down to (2,0) is a hole; Right to (1,1) is safe.
        So Right to (1,1) is safe, then ..." (the choice is written after what it
        depends on, instead of before it)."""
        assert self.player is not None
        actions = self._demonstration_actions(rng, noise)
        pos, clauses = self.player, []
        for action in actions:
            pos, clause = self._describe(pos, action)
            clauses.append(clause)
            if pos in self.holes or pos == self.goal:
                break  # the episode would end here; later moves would not run
        head = f"At {fmt_pos(self.player)}, goal {fmt_pos(self.goal)}. "
        if weigh:
            head += (
                "; ".join(self._describe(self.player, m)[1] for m in self.toward_goal()) + ". So "
            )
        reasoning = head + ", then ".join(clauses) + "."
        if restate:
            if not self.show_map:
                raise ValueError("restate copies the map's rows; this env has show_map=False")
            reasoning = "\n".join(self.map_rows()) + "\n" + reasoning
        return reasoning, " || ".join(actions)


def parse_grid(grid: str | Sequence[str]) -> tuple[int, frozenset[Pos], Pos, Pos]:
    """Read a square map in the render symbols: (size, holes, start, goal)."""
    rows = [r.strip() for r in (grid.strip().splitlines() if isinstance(grid, str) else grid)]
    size = len(rows)
    if size < 2 or any(len(r) != size for r in rows):
        raise ValueError("a FrozenLake map must be square and at least 2x2")
    holes, starts, goals = set(), [], []
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch == "H":
                holes.add((r, c))
            elif ch == "P":
                starts.append((r, c))
            elif ch == "G":
                goals.append((r, c))
            elif ch != "_":
                raise ValueError(f"unknown FrozenLake symbol {ch!r} at {(r, c)}")
    if len(starts) != 1 or len(goals) != 1:
        raise ValueError("a map needs exactly one P and one G")
    return size, frozenset(holes), starts[0], goals[0]
