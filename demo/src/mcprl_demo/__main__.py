"""``python -m mcprl_demo``: see :mod:`mcprl_demo.cli`."""

import sys

from mcprl_demo.cli import main

sys.exit(main())
