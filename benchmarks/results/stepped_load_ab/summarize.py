import json, glob, statistics, sys, collections
rows = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/*-*-*.json")):
    name, arm, rnd = f.split("/")[-1][:-5].split("-")
    d = json.load(open(f))
    for r in d["records"]:
        if r["source"] != "simulation": continue
        ph = {k: (v["measured_ms"], v["predicted_ms"]) for k, v in r["phase_err"].items()}
        rows[(name, arm)].append((rnd, r["rank"], r["real_iter_ms"], r["pred_iter_ms"], r["iter_err_pct"], ph))
for (name, arm), rs in sorted(rows.items()):
    errs = [x[4] for x in rs]
    pred = [x[3] for x in rs]; real = [x[2] for x in rs]
    phases = {k: statistics.median(x[5][k][1] for x in rs) for k in rs[0][5]}
    print(f"{name:4} {arm:8} err {statistics.mean(errs):+6.1f} (|{statistics.mean(map(abs,errs)):.1f}|) real {statistics.median(real):7.1f} pred {statistics.median(pred):7.1f}  pred phases " +
          " ".join(f"{k[:4]} {v:6.2f}" for k, v in sorted(phases.items())))
