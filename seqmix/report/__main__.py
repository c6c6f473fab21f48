"""``python -m seqmix.report <multirun dir>``."""

import sys

from seqmix.report import main

sys.exit(main())
