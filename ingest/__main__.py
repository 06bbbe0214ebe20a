"""`python -m ingest`: see `ingest.service`."""

import sys

from ingest.service import main

sys.exit(main())
