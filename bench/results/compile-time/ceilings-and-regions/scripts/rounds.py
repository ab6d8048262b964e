"""Run `korch-tvm ARGS...` recording every library timing round (call key -> [round seconds])
into rounds.json in the working directory: how far a call's rounds agree."""
import atexit
import json
import sys

from korch_tvm.costing.library_costs import entry_key
from korch_tvm.library import implementations

seen = {}
original = implementations.Implementation.measure


def measure(self, *args, **kwargs):
    value = original(self, *args, **kwargs)
    seen.setdefault(entry_key(self), []).append(value)
    return value


implementations.Implementation.measure = measure
atexit.register(lambda: json.dump(seen, open("rounds.json", "w"), indent=0))
from korch_tvm.tools.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
