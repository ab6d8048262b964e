"""Record every library timing round of a compile (key -> [round seconds...]) into rounds.json."""
import atexit, json, sys
from korch_tvm.library import implementations as impl
from korch_tvm.costing.library_costs import entry_key
seen = {}
original = impl.Implementation.measure
def measure(self, *a, **k):
    value = original(self, *a, **k)
    seen.setdefault(entry_key(self), []).append(value)
    return value
impl.Implementation.measure = measure
atexit.register(lambda: json.dump(seen, open(sys.argv.pop(1) if False else "/tmp/prof/rounds.json", "w"), indent=0))
from korch_tvm.tools.cli import main
sys.exit(main(sys.argv[1:]))
