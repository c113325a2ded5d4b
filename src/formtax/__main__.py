"""``python -m formtax`` is the ``formtax`` command."""

import sys

from formtax.cli.main import main

sys.exit(main())
