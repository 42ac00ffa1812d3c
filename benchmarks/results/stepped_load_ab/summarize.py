"""The stepped-load A/B's table: `python summarize.py DIR` over DIR's {case}-{arm}-{round}.json."""

import collections
import glob
import json
import statistics
import sys

rows = collections.defaultdict(list)
for path in sorted(glob.glob(sys.argv[1] + "/*-*-*.json")):
    name, arm, _ = path.split("/")[-1][:-5].split("-")
    for r in json.load(open(path))["records"]:
        if r["source"] == "simulation":
            phases = {k: v["predicted_ms"] for k, v in r["phase_err"].items()}
            rows[(name, arm)].append((r["real_iter_ms"], r["pred_iter_ms"], r["iter_err_pct"], phases))
for (name, arm), rs in sorted(rows.items()):
    errs = [x[2] for x in rs]
    phases = {k: statistics.median(x[3][k] for x in rs) for k in rs[0][3]}
    print(
        f"{name:4} {arm:8} err {statistics.mean(errs):+6.1f} (|{statistics.mean(map(abs, errs)):.1f}|) "
        f"real {statistics.median(x[0] for x in rs):7.1f} pred {statistics.median(x[1] for x in rs):7.1f}  "
        "pred phases " + " ".join(f"{k[:4]} {v:6.2f}" for k, v in sorted(phases.items()))
    )
