"""mcprl-art: OpenPipe ART's client API against the mcp-rl stack (an optional extra).

``make setup-art`` installs it with a pinned ``openpipe-art``; no service imports it. It
converts ART's shapes to ours and back (:mod:`mcprl_art.shapes` for trajectories and score
groups, :mod:`mcprl_art.records` for the trainer's token records,
:mod:`mcprl_art.scenarios` for scenario sets), scores ART groups with our judge
(:mod:`mcprl_art.judge`) and compares that with ``art.rewards.ruler_score_group``
(:mod:`mcprl_art.parity`).

Importing ``art`` has side effects this package turns off (the first two unless the caller
set the variables first): python-dotenv would load the repository's ``.env`` into the
process (found by walking up from site-packages inside ``.venv``); litellm would fetch its
model price list from the internet at import time; and ``art`` replaces a private function
of transformers (``masking_utils._preprocess_mask_arguments``) with a wrapper written for
another transformers version, which breaks every forward pass of transformers 5.23
(``TypeError: ... missing 1 required positional argument: 'layer_idx'``). Importing this
package imports ``art`` and puts transformers' own function back.
"""

from __future__ import annotations

import os

os.environ.setdefault("PYTHON_DOTENV_DISABLED", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ART_VERSION = "0.5.18"  # the openpipe-art this bridge is built and tested against (pinned)


def undo_art_transformers_patch() -> bool:
    """Put back transformers' ``_preprocess_mask_arguments`` if ``art`` replaced it."""

    try:
        from art.transformers import patches
        from transformers import masking_utils
    except ImportError:  # no transformers: nothing was patched
        return False
    original = patches._preprocess_mask_arguments
    if masking_utils._preprocess_mask_arguments is original:
        return False
    masking_utils._preprocess_mask_arguments = original
    return True


import art  # noqa: E402 - after the variables above

undo_art_transformers_patch()

__all__ = ["ART_VERSION", "art", "undo_art_transformers_patch"]
