"""``python -m seqmix.average ... --out avg.ckpt``."""

import sys

from seqmix.average import main

sys.exit(main())
