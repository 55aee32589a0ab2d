"""What the grid envs (FrozenLake, Sokoban) share: positions as text and the plan a
breadth-first search found.

This module imports neither torch nor Ray.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

Pos = tuple[int, int]
State = TypeVar("State", bound=Hashable)


def fmt_pos(pos: Pos) -> str:
    """A position as the observations write it: ``(row,col)``."""
    return f"({pos[0]},{pos[1]})"


def backtrack(parent: Mapping[State, tuple[State, str] | None], node: State) -> list[str]:
    """The actions that lead from a BFS's start (whose parent is None) to ``node``."""
    plan = []
    while parent[node] is not None:
        node, action = parent[node]  # type: ignore[misc]
        plan.append(action)
    return plan[::-1]
