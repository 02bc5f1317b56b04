"""`python -m hf_dspark.cli` = `hf-dspark`."""

import sys

from . import main

sys.exit(main())
