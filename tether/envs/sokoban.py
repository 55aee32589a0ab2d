"""Sokoban: push every box onto a target within a small move budget.

Levels are generated procedurally (a walled room, a few random interior walls,
random targets, boxes and player) and kept only if a breadth-first search over
(player, boxes) states solves them within the episode's action budget and they
are not already solved.  The same BFS is the env's optimal solver, which the
warm-start demonstrations follow.

Rewards (docs/methods.md section 11, as in gym-sokoban): −0.1 per move, +1 for a push that puts a
box on a target, −1 for a push that takes one off, +10 when every box is placed
(the episode ends).  A move into a wall, or a push against a wall or another
box, leaves the state unchanged but still costs the step.

Grid symbols (ASCII only, so the byte-level tokenizer sees one token each):
``#`` wall, ``_`` floor, ``O`` target, ``X`` box, ``*`` box on target,
``P`` player, ``+`` player on target.  Coordinates are (row,col), 0-based from
the top-left corner, walls included.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import MultiTurnTextEnv
from .grid import Pos, backtrack, fmt_pos

Boxes = tuple[Pos, ...]  # always sorted, so equal box sets compare equal

MOVES: dict[str, Pos] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
STEP_REWARD, BOX_ON_REWARD, BOX_OFF_REWARD, SOLVED_REWARD = -0.1, 1.0, -1.0, 10.0
#: BFS gives up beyond this many states (a 6x6 room with 2 boxes has a few thousand).
MAX_SEARCH_STATES = 200_000
GENERATION_TRIES = 2_000


def _add(pos: Pos, delta: Pos) -> Pos:
    return (pos[0] + delta[0], pos[1] + delta[1])


def move(
    walls: frozenset[Pos], targets: frozenset[Pos], player: Pos, boxes: Boxes, action: str
) -> tuple[Pos, Boxes, float]:
    """One Sokoban move: the new (player, boxes) and the push reward (±1 or 0)."""
    delta = MOVES[action]
    ahead = _add(player, delta)
    if ahead in walls:
        return player, boxes, 0.0
    if ahead not in boxes:
        return ahead, boxes, 0.0
    beyond = _add(ahead, delta)
    if beyond in walls or beyond in boxes:
        return player, boxes, 0.0
    new_boxes = tuple(sorted(beyond if b == ahead else b for b in boxes))
    push_reward = 0.0
    if beyond in targets and ahead not in targets:
        push_reward = BOX_ON_REWARD
    elif ahead in targets and beyond not in targets:
        push_reward = BOX_OFF_REWARD
    return ahead, new_boxes, push_reward


def solve_sokoban(
    walls: frozenset[Pos],
    targets: frozenset[Pos],
    player: Pos,
    boxes: Boxes,
    max_depth: int | None = None,
    max_states: int = MAX_SEARCH_STATES,
) -> list[str] | None:
    """Shortest move sequence that puts every box on a target (BFS), or None.

    ``[]`` means already solved; None means unsolvable within ``max_depth`` moves
    (or the search hit ``max_states``)."""
    if set(boxes) == targets:
        return []
    start = (player, boxes)
    parent: dict[tuple[Pos, Boxes], tuple[tuple[Pos, Boxes], str] | None] = {start: None}
    frontier = deque([(start, 0)])
    while frontier:
        state, depth = frontier.popleft()
        if max_depth is not None and depth >= max_depth:
            continue
        for action in MOVES:
            new_player, new_boxes, _ = move(walls, targets, state[0], state[1], action)
            nxt = (new_player, new_boxes)
            if nxt in parent:
                continue
            parent[nxt] = (state, action)
            if set(new_boxes) == targets:
                return backtrack(parent, nxt)
            if len(parent) >= max_states:
                return None
            frontier.append((nxt, depth + 1))
    return None


class SokobanEnv(MultiTurnTextEnv):
    """Procedurally generated Sokoban with text observations and text actions.

    Args:
        dim: room size (rows, cols) including the outer wall.
        num_boxes: boxes (and as many targets).
        max_walls: interior walls are drawn uniformly from 0..max_walls.
        min_plan_length: the optimal plan must have at least this many moves.
        stochasticity, format_penalty, max_turns, max_actions_per_turn, max_actions:
            as in ``MultiTurnTextEnv``.
    """

    action_names = ("Up", "Down", "Left", "Right")

    def __init__(
        self,
        dim: Sequence[int] = (6, 6),
        num_boxes: int = 1,
        max_walls: int = 3,
        min_plan_length: int = 1,
        stochasticity: float = 0.0,
        format_penalty: float = -0.1,
        max_turns: int | None = None,
        max_actions_per_turn: int | None = None,
        max_actions: int | None = None,
    ) -> None:
        super().__init__(
            stochasticity, format_penalty, max_turns, max_actions_per_turn, max_actions
        )
        self.dim = (int(dim[0]), int(dim[1]))
        self.num_boxes = int(num_boxes)
        self.max_walls = int(max_walls)
        self.min_plan_length = max(1, int(min_plan_length))
        interior = (self.dim[0] - 2) * (self.dim[1] - 2)
        if min(self.dim) < 3 or self.num_boxes < 1 or interior < 2 * self.num_boxes + 1:
            raise ValueError(
                f"a {self.dim} room cannot hold {self.num_boxes} box(es), "
                "their targets and the player"
            )
        if self.min_plan_length > self.max_actions:
            raise ValueError("min_plan_length exceeds max_actions")
        self.walls: frozenset[Pos] = frozenset()
        self.targets: frozenset[Pos] = frozenset()
        self.player: Pos | None = None
        self.boxes: Boxes = ()
        self.shape = self.dim  # of the current level (a loaded grid may differ from dim)

    # -- level generation ---------------------------------------------------------------
    def _generate(
        self, rng: np.random.Generator
    ) -> tuple[frozenset[Pos], frozenset[Pos], Pos, Boxes]:
        rows, cols = self.dim
        border = {
            (r, c)
            for r in range(rows)
            for c in range(cols)
            if r in (0, rows - 1) or c in (0, cols - 1)
        }
        interior = [(r, c) for r in range(1, rows - 1) for c in range(1, cols - 1)]
        needed = 2 * self.num_boxes + 1
        for _ in range(GENERATION_TRIES):
            n_walls = int(rng.integers(0, self.max_walls + 1))
            n_walls = min(n_walls, len(interior) - needed)
            order = rng.permutation(len(interior))
            cells = [interior[i] for i in order]
            walls = frozenset(border | set(cells[:n_walls]))
            free = cells[n_walls:]
            targets = frozenset(free[: self.num_boxes])
            boxes = tuple(sorted(free[self.num_boxes : 2 * self.num_boxes]))
            player = free[2 * self.num_boxes]
            plan = solve_sokoban(walls, targets, player, boxes, max_depth=self.max_actions)
            if plan is not None and len(plan) >= self.min_plan_length:
                return walls, targets, player, boxes
        raise RuntimeError(
            f"no solvable Sokoban level for dim={self.dim}, "
            f"num_boxes={self.num_boxes} in {GENERATION_TRIES} tries; "
            "use a larger room or a larger max_actions"
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """New level named by ``seed``; ``options={"grid": [...]}`` loads a fixed
        level written in the render symbols (for tests and curated sets)."""
        rng = self._seed_level_rng(seed)
        if options and options.get("grid") is not None:
            self.walls, self.targets, self.player, self.boxes = parse_grid(options["grid"])
        else:
            self.walls, self.targets, self.player, self.boxes = self._generate(rng)
        cells = self.walls | self.targets | set(self.boxes) | {self.player}
        self.shape = (max(r for r, _ in cells) + 1, max(c for _, c in cells) + 1)
        self._start_episode()
        self.done = set(self.boxes) == self.targets
        return self._reset_result()

    # -- dynamics -----------------------------------------------------------------------
    def _apply(self, action_name: str) -> tuple[float, bool, bool]:
        assert self.player is not None
        self.player, self.boxes, push = move(
            self.walls, self.targets, self.player, self.boxes, action_name
        )
        solved = set(self.boxes) == self.targets
        return STEP_REWARD + push + (SOLVED_REWARD if solved else 0.0), solved, solved

    def solve(self) -> list[str] | None:
        if self.player is None:
            return None
        return solve_sokoban(self.walls, self.targets, self.player, self.boxes)

    # -- text ---------------------------------------------------------------------------
    def rules(self) -> str:
        return (
            "Sokoban: push every box X onto a target O. # wall, _ floor, * box on target, "
            "P player, + player on target; positions are (row,col). Moves: Up, Down, "
            "Left, Right; walk into a box to push it, you cannot pull. "
            "Reward -0.1 a move, +1 box on target, -1 box off, +10 when all are placed."
        )

    def render(self) -> str:  # type: ignore[override]
        if self.player is None:
            return "No level: call reset()."
        rows, cols = self.shape
        lines = []
        for r in range(rows):
            line = []
            for c in range(cols):
                p = (r, c)
                on_target = p in self.targets
                if p in self.walls:
                    line.append("#")
                elif p == self.player:
                    line.append("+" if on_target else "P")
                elif p in self.boxes:
                    line.append("*" if on_target else "X")
                else:
                    line.append("O" if on_target else "_")
            lines.append("".join(line))
        lines.append(
            f"Player {fmt_pos(self.player)}. Boxes {_fmt_many(self.boxes)}. "
            f"Targets {_fmt_many(sorted(self.targets))}."
        )
        return "\n".join(lines)

    def demonstration(self, rng: np.random.Generator, noise: float = 0.0) -> tuple[str, str]:
        """Reasoning that names the player, boxes and targets and what each chosen
        move does (from a simulation), then the moves: the optimal plan's next
        ≤2 moves, or with probability ``noise`` as many random moves."""
        actions = self._demonstration_actions(rng, noise)
        assert self.player is not None
        player, boxes, clauses = self.player, self.boxes, []
        for action in actions:
            new_player, new_boxes, _ = move(self.walls, self.targets, player, boxes, action)
            if new_player == player:
                clauses.append(f"{action} is blocked")
            elif new_boxes != boxes:
                pushed = _add(new_player, MOVES[action])
                where = " on target" if pushed in self.targets else ""
                clauses.append(f"{action} pushes box to {fmt_pos(pushed)}{where}")
            else:
                clauses.append(f"{action} to {fmt_pos(new_player)}")
            player, boxes = new_player, new_boxes
        box_word = "box" if len(self.boxes) == 1 else "boxes"
        target_word = "target" if len(self.targets) == 1 else "targets"
        reasoning = (
            f"At {fmt_pos(self.player)}, {box_word} {_fmt_many(self.boxes)}, "
            f"{target_word} {_fmt_many(sorted(self.targets))}. " + ", then ".join(clauses) + "."
        )
        return reasoning, " || ".join(actions)


def _fmt_many(positions: Sequence[Pos]) -> str:
    return ",".join(fmt_pos(p) for p in positions)


def parse_grid(grid: str | Sequence[str]) -> tuple[frozenset[Pos], frozenset[Pos], Pos, Boxes]:
    """Read a level written in the render symbols: (walls, targets, player, boxes)."""
    rows = grid.strip().splitlines() if isinstance(grid, str) else list(grid)
    walls, targets, boxes, players = set(), set(), [], []
    for r, row in enumerate(rows):
        for c, ch in enumerate(row.strip()):
            p = (r, c)
            if ch == "#":
                walls.add(p)
            elif ch in "O*+":
                targets.add(p)
            elif ch not in "_XP":
                raise ValueError(f"unknown Sokoban symbol {ch!r} at {p}")
            if ch in "X*":
                boxes.append(p)
            if ch in "P+":
                players.append(p)
    if len(players) != 1 or not boxes or len(boxes) != len(targets):
        raise ValueError("a level needs one player and as many boxes as targets")
    return frozenset(walls), frozenset(targets), players[0], tuple(sorted(boxes))
