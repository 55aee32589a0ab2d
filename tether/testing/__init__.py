"""Test machinery that ships with the package: the known-answer harness (micro policies
whose input dependence is known, run through the real diagnostics) and known-answer RL
(``learning``: the real loop on tasks whose optimum is known).

It sits above the diagnostics and the model layer (docs/architecture.md): it fine-tunes
tiny policies to test the diagnostics, which themselves import no model code.
"""
