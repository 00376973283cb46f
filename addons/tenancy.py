"""mitmproxy addon: route, attribute, record and flag every tenant flow of a tenancy audit.

    mitmdump -s addons/tenancy.py --set tenancy_registry=registry.yaml --set tenancy_ledger=ledger.jsonl \\
        --mode reverse:http://127.0.0.1:9001@8001 --mode reverse:http://127.0.0.1:9002@8002

`Tenancy` (its routing and inspection parts composed as one addon) lives in `harness.capture.addon`; see
docs/addon.md.
"""

import sys
from pathlib import Path

try:
    import harness  # noqa: F401 - installed (editable) in the harness venv
except ImportError:  # run from a checkout: mitmdump -s addons/tenancy.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.capture.addon import Tenancy

addons = [Tenancy(script=True)]
