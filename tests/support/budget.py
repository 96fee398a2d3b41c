"""How many examples a property test tries: its own budget, scaled by the session's Hypothesis
profile (registered in tests/conftest.py, chosen with COREPIN_HYPOTHESIS_PROFILE).

A test states its budget under the default profile, `@settings(max_examples=examples(150))`;
the `ci` profile multiplies every budget by 5, the `fast` one divides it by 10. (The settings
a test builds at import inherit the rest from the profile: no deadline, no slow-data check.)
"""

from __future__ import annotations

from hypothesis import settings

#: The examples of the default profile (Hypothesis' own default): budgets are relative to it.
BASE_EXAMPLES = 100


def examples(budget: int) -> int:
    """`budget` examples under the default profile, as many more or fewer under the session's
    profile as its own examples are (at least one)."""
    return max(1, budget * settings.default.max_examples // BASE_EXAMPLES)
