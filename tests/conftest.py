"""The suite's shared helpers (`grammar`: strategies from the instance format) import by name
from every test folder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
