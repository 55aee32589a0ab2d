"""Tether: Ray-native multi-turn agent RL that detects and prevents template collapse."""

__version__ = "0.1.0"
