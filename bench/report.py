"""Turns a run's raw results (DIR/<date>.json) into the table (DIR/<date>.md)
and the chart (DIR/<date>.png).  bench/run calls it at the end of a run;
running it by hand re-renders an old run:

    /var/tmp/pgkvx-venv/bin/python bench/report.py bench/out/2025-01-01-120000.json

Aggregation (every number compares runs of one harness run only):
- tps, p50, p99: the median over the repetitions of each run's value;
- x plain, x fenced: the median over the repetitions of the per-repetition
  ratio, pairing each run with the baseline run of the same round (the modes
  of a round run back to back, so slow drift of a shared machine cancels out).
"""
import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from common import durability_text  # noqa: E402


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _runs_by_rep(runs, key, mode):
    return {r["rep"]: r for r in runs if r[key[0]] == key[1] and r["mode"] == mode}


def _paired_ratio(runs, key, mode, base, field, available):
    """Median over repetitions of run(mode)[field] / run(base)[field]."""
    if base not in available:
        return None
    mine, theirs = _runs_by_rep(runs, key, mode), _runs_by_rep(runs, key, base)
    ratios = [mine[r][field] / theirs[r][field] for r in mine
              if r in theirs and mine[r][field] and theirs[r][field]]
    return _median(ratios)


def fmt(v, spec="{:.2f}", none="–"):
    return none if v is None else spec.format(v)


def fmt_tps(v):
    return fmt(v, "{:,.0f}")


def fmt_k(v):
    """Compact tps for chart labels: 15.4k."""
    return None if v is None else (f"{v / 1000:.1f}k" if v >= 1000 else f"{v:.0f}")


def fmt_ratio(v):
    return fmt(v, "{:.2f}×")


def kv_cells(result):
    """One dict per workload x mode, in report order."""
    runs, modes = result["kv"], result["kv_modes"]
    available = [m["name"] for m in modes]
    cells = []
    for wl in result["workloads"]:
        for m in modes:
            cell = {"workload": wl, "mode": m["name"], "label": m["label"]}
            mine = [r for r in runs if r["workload"] == wl and r["mode"] == m["name"]]
            tps = [r["tps"] for r in mine if r.get("tps") is not None]
            cell.update(
                runs=len(mine),
                tps=_median(tps),
                tps_min=min(tps, default=None),
                tps_max=max(tps, default=None),
                p50=_median(r.get("p50_ms") for r in mine),
                p99=_median(r.get("p99_ms") for r in mine),
                x_plain=_paired_ratio(runs, ("workload", wl), m["name"], "plain", "tps",
                                      available),
                x_fenced=_paired_ratio(runs, ("workload", wl), m["name"], "fenced", "tps",
                                       available),
                failed=sum(r.get("failed") or 0 for r in mine),
                errors=sorted({e for r in mine for e in r.get("errors", [])}),
                stats=_mean_stats(mine),
                plan=result.get("plans", {}).get(wl, {}).get(m["name"]),
            )
            cells.append(cell)
    return cells


def tail_cells(result):
    runs, modes = result["tail"], result["tail_modes"]
    cells = []
    for sc in result["scenarios"]:
        for m in modes:
            mine = [r for r in runs if r["scenario"] == sc and r["mode"] == m["name"]]
            ok = [r for r in mine if "error" not in r]
            cells.append({
                "scenario": sc, "mode": m["name"], "label": m["label"], "runs": len(mine),
                "commits_per_s": _median(r["commits_per_s"] for r in ok),
                "delivered_per_s": _median(r["delivered_per_s"] for r in ok),
                "lag_p50": _median(r["lag_p50_ms"] for r in ok),
                "lag_p99": _median(r["lag_p99_ms"] for r in ok),
                "skipped": sum(r["skipped"] or 0 for r in ok) if ok else None,
                "delivered_of": sum(r["committed"] * result["config"]["tail"]["consumers"]
                                    for r in ok),
                "timed_out": any(r["drain_timed_out"] for r in ok),
                "plan": next((r["scan_node"] for r in ok), None),
                "errors": sorted({e for r in mine for e in r.get("errors", [])}
                                 | {r["error"] for r in mine if "error" in r}),
                "stats": _mean_stats(ok),
            })
    return cells


def _mean_stats(runs):
    """pgkvx counter deltas, averaged per run."""
    total = {}
    for r in runs:
        for k, v in (r.get("stats") or {}).items():
            total[k] = total.get(k, 0) + v
    return {k: v / len(runs) for k, v in total.items()} if runs else {}


def _stats_text(stats):
    return ", ".join(f"{k}={v:,.0f}" for k, v in sorted(stats.items()))


def markdown(result):
    cfg, mach = result["config"], result["machine"]
    out = [f"# pgkvx benchmark, {result['started']}" + (" (quick)" if cfg["quick"] else ""), ""]
    if result.get("interrupted"):
        out += ["**Interrupted**: the tables hold only the runs that finished.", ""]
    out += [
        f"- machine: {mach['nproc']} CPUs ({mach['cpu']}), {mach['ram_gib']} GiB RAM, "
        f"kernel {mach['kernel']}",
        f"- {mach['postgres'].split(' on ')[0]}; settings: "
        + ", ".join(f"{k}={v}" for k, v in mach["settings"].items()),
        f"- commits: {durability_text(cfg)}",
        f"- pgkvx {mach['pgkvx_version']}: {mach['pgkvx_library']}",
        *(["- pgkvx shared memory in use at the start: "
            + ", ".join(f"{k}={v:,}" for k, v in mach["pgkvx_gauges"].items())]
          if mach.get("pgkvx_gauges") else []),
        f"- harness commit {mach['harness_commit']}; run took "
        f"{result['elapsed_s'] / 60:.1f} min; load average (1 min) "
        f"{mach['loadavg']:.1f} at the start, {result['loadavg_end']:.1f} at the end "
        "(other work on the machine adds noise)",
        "",
    ]
    kv = cfg["kv"]
    if result["workloads"]:
        out += [
            "## kv workloads (pgbench)", "",
            f"`pgbench -n -M prepared -c {kv['clients']} -j {kv['jobs']} -T {kv['duration']}`, "
            f"{kv['reps']} repetition(s), modes interleaved per round; kv reloaded from the "
            f"same {kv['keys']:,} random keys, vacuumed and checkpointed before every run. "
            "tps and latencies: median over repetitions; ratios: median of per-round ratios "
            "(see bench/README.md).", "",
            "| workload | mode | tps | tps min–max | p50 ms | p99 ms | × plain PG | × fenced "
            "| scan node | failed tx / errors |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
        ]
        for c in kv_cells(result):
            spread = (f"{fmt_tps(c['tps_min'])}–{fmt_tps(c['tps_max'])}"
                      if c["tps_min"] is not None else "–")
            out.append(f"| {c['workload']} | {c['label']} | {fmt_tps(c['tps'])} | {spread} | "
                       f"{fmt(c['p50'])} | {fmt(c['p99'])} | {fmt_ratio(c['x_plain'])} | "
                       f"{fmt_ratio(c['x_fenced'])} | {c['plan'] or '–'} | "
                       f"{c['failed']} / {len(c['errors'])} |")
        out.append("")
    if result["scenarios"]:
        t = cfg["tail"]
        out += [
            "## tail consumers", "",
            f"{t['producers']} producers (one row per transaction, commit delay uniform "
            f"0–{t['max_commit_delay_ms']:g} ms, {t['rollback_fraction']:.0%} rolled back) for "
            f"{t['duration']:g} s; {t['consumers']} consumers, each reading the whole stream "
            f"with LIMIT {t['limit']}; {t['reps']} repetition(s), modes interleaved. "
            "Lag: producer's COMMIT returned → row delivered. Skipped: committed rows a "
            "consumer never delivered, summed over consumers and repetitions.", "",
            "| scenario | mode | commits/s | rows/s delivered (per consumer) | lag p50 ms "
            "| lag p99 ms | skipped rows | scan node | errors |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
        ]
        for c in tail_cells(result):
            skipped = "–" if c["skipped"] is None else (
                f"{c['skipped']:,} of {c['delivered_of']:,} "
                f"({100.0 * c['skipped'] / max(1, c['delivered_of']):.1f}%)")
            if c["timed_out"]:
                skipped += " (drain timed out)"
            out.append(f"| {c['scenario']} | {c['label']} | {fmt_tps(c['commits_per_s'])} | "
                       f"{fmt_tps(c['delivered_per_s'])} | {fmt(c['lag_p50'])} | "
                       f"{fmt(c['lag_p99'])} | {skipped} | {c['plan'] or '–'} | "
                       f"{len(c['errors'])} |")
        out.append("")
    if result.get("wake"):
        out += wake_markdown(result["wake"])
    unscanned = sorted({c["label"] for c in kv_cells(result) + tail_cells(result)
                        if c["mode"] in ("fenced", "optimistic") and c["plan"] == "plain"})
    if unscanned:
        out += [f"**Note**: {' and '.join(unscanned)} got plain plans (no `PgkvxLimitScan`): "
                "the planner did not give these queries pgkvx's LIMIT scan, so those rows "
                "measure a latched table read by plain scans, not pgkvx's scan modes.", ""]
    counters = [(f"{c.get('workload', c.get('scenario'))}", c["label"], c["stats"])
                for c in kv_cells(result) + tail_cells(result) if c["stats"]]
    if counters:
        out += ["## pgkvx counters (mean per run)", "",
                "pgkvx.stats(): how much each counter moved during the run; for the gauges "
                "of capacity in use (`*_used`), the value at the end of the run.", "",
                "| workload | mode | counters |", "| --- | --- | --- |"]
        out += [f"| {w} | {m} | {_stats_text(s)} |" for w, m, s in counters]
        out.append("")
    problems = [(c.get("workload", c.get("scenario")), c["label"], e)
                for c in kv_cells(result) + tail_cells(result) for e in c["errors"]]
    if problems:
        out += ["## Errors reported by the runs", ""]
        out += [f"- {w} / {m}: `{e}`" for w, m, e in problems]
        out.append("")
    return "\n".join(out)


def _grouped_bars(ax, groups, series, values, annotate=None):
    """values[(group, series)] -> height; missing keys leave a gap."""
    width = 0.8 / max(1, len(series))
    for i, s in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        hs = [values.get((grp, s)) for grp in groups]
        bars = ax.bar([x for x, h in zip(xs, hs) if h is not None],
                      [h for h in hs if h is not None], width, label=s)
        if annotate:
            texts = [annotate.get((grp, s)) for grp, h in zip(groups, hs) if h is not None]
            for bar, text in zip(bars, texts):
                if text:
                    ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.legend(fontsize=8)


def chart(result, path):
    kv, tail = kv_cells(result), tail_cells(result)
    kv_modes = [m["label"] for m in result["kv_modes"]]
    tail_modes = [m["label"] for m in result["tail_modes"]]
    wake_cfgs = wake_configs(result.get("wake"))
    panels = (2 if result["kv"] else 0) + (1 if result["tail"] else 0) + (2 if wake_cfgs else 0)
    fig, axes = plt.subplots(max(1, panels), 1, figsize=(12, 4 * max(1, panels)), squeeze=False)
    axes = list(axes[:, 0])
    title = f"pgkvx benchmark {result['started']}" + (" (quick)" if result["config"]["quick"]
                                                      else "")
    fig.suptitle(title, fontsize=10)
    if result["kv"]:
        wls = result["workloads"]
        plain_tps = {c["workload"]: c["tps"] for c in kv if c["mode"] == "plain"}
        ax = axes.pop(0)
        _grouped_bars(ax, wls, kv_modes,
                      {(c["workload"], c["label"]): c["x_plain"] for c in kv},
                      {(c["workload"], c["label"]): fmt_k(c["tps"]) for c in kv})
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticklabels([f"{w}\n(plain {fmt_tps(plain_tps.get(w))} tps)" for w in wls],
                           fontsize=8)
        ax.set_ylabel("tps ÷ plain PG (same round)")
        ax.set_title("kv workloads: throughput relative to plain PostgreSQL (labels: tps)")
        ax = axes.pop(0)
        _grouped_bars(ax, wls, kv_modes, {(c["workload"], c["label"]): c["p99"] for c in kv})
        ax.set_xticklabels(wls, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("p99 latency, ms (log)")
        ax.set_title("kv workloads: p99 latency")
    if result["tail"]:
        ax = axes.pop(0)
        scs = result["scenarios"]
        _grouped_bars(ax, scs, tail_modes,
                      {(c["scenario"], c["label"]): c["lag_p99"] for c in tail},
                      {(c["scenario"], c["label"]):
                       None if c["skipped"] is None else f"skipped {c['skipped']:,}"
                       for c in tail})
        ax.set_xticklabels(scs, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("consumer lag p99, ms (log)")
        ax.set_title("tail consumers: commit-to-delivery lag p99 (labels: rows never delivered)")
    if wake_cfgs:
        wake_chart(axes.pop(0), axes.pop(0), result["wake"], wake_cfgs)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ wake

WAKE_LABELS = {"poll1": "(a) poll 1 ms", "poll100": "(b) poll 100 ms",
               "notify": "(c) LISTEN/NOTIFY", "wait_for": "(d) pgkvx.wait_for",
               "pgq": "(e) PgQ (pgqd default tick)"}
WAKE_MIN_WAITS = 100   # waits below which the wake-up alone is not judged
WAKE_FIELDS = ("producer_tps", "events_per_s", "delivered_per_s", "lag_p50_ms", "lag_p99_ms",
               "lag_max_ms", "inorder_p50_ms", "inorder_p99_ms", "inorder_max_ms",
               "queries_per_row", "wakeups_per_batch", "read_p50_ms", "read_p99_ms",
               "wake_p50_ms", "wake_p99_ms", "wake_n")


def wake_configs(wake):
    """The (producers, rows) configurations the matrix ran, in order."""
    if not wake:
        return []
    seen = []
    for c in wake["cells"]:
        key = (c["producers"], c["rows"], c["max_delay_ms"])
        if c["scenario"] == "steady" and key not in seen:
            seen.append(key)
    return seen


def wake_cells(wake):
    """One dict per scenario x config x kind: medians over repetitions,
    skips and errors summed."""
    groups = {}
    for c in wake["cells"]:
        groups.setdefault((c["scenario"], c["producers"], c["rows"], c["max_delay_ms"], c["kind"]),
                          []).append(c)
    cells = []
    for (sc, p, r, d, k), runs in groups.items():
        ok = [x for x in runs if "error" not in x]
        cell = {"scenario": sc, "producers": p, "rows": r, "delay": d, "kind": k, "runs": len(runs),
                "label": WAKE_LABELS.get(k, k)}
        for f in WAKE_FIELDS:
            cell[f] = _median(x.get(f) for x in ok)
        cell["skipped"] = sum(x.get("skipped") or 0 for x in ok) if ok else None
        cell["wait_timeouts"] = sum(x.get("wait_timeouts") or 0 for x in ok)
        cell["phantoms"] = sum(x.get("phantoms") or 0 for x in ok)
        cell["duplicates"] = sum(x.get("duplicates") or 0 for x in ok)
        cell["committed"] = sum(x.get("committed") or 0 for x in ok)
        cell["timed_out"] = any(x.get("drain_timed_out") for x in ok)
        cell["errors"] = sorted({e for x in runs for e in x.get("errors", [])}
                                | {x["error"] for x in runs if "error" in x})
        cells.append(cell)
    return cells


def wake_pairs(wake):
    """Per condition: the ratios over rounds.  Same-table conditions: tps of
    the side whose table has the waiters / tps of the other side, same run
    (the control: side A / side B with nobody waiting).  Other-table: total
    tps of both sides / total tps of the control run of the same round."""
    control = {p["round"]: p for p in wake["pairs"] if p["condition"] == "none" and "error" not in p}
    out = []
    conds = []
    for p in wake["pairs"]:
        if p["condition"] not in conds:
            conds.append(p["condition"])
    for cond in conds:
        runs = [p for p in wake["pairs"] if p["condition"] == cond]
        ok = [p for p in runs if "error" not in p]
        if cond == "100-other":
            ratios = [p["total_tps"] / control[p["round"]]["total_tps"] for p in ok
                      if p["round"] in control and control[p["round"]]["total_tps"]]
        else:
            ratios = [p["ratio"] for p in ok if p.get("ratio")]
        out.append({"condition": cond, "rounds": len(ok), "waiters": max((p["waiters"] for p in ok), default=0),
                    "ratio": _median(ratios), "min": min(ratios, default=None),
                    "max": max(ratios, default=None),
                    "tps_a": _median(p["tps_a"] for p in ok), "tps_b": _median(p["tps_b"] for p in ok),
                    "total": _median(p["total_tps"] for p in ok),
                    "waiter_calls": _median((p.get("stats") or {}).get("wait_for_calls", 0) for p in ok),
                    "errors": sorted({p["error"] for p in runs if "error" in p}
                                     | {e for p in ok for e in p.get("errors", [])})})
    return out


def wake_keepup(wake):
    """Per rows/tx: producers alone (their maximum rate) against producers
    with one wait_for consumer, medians over rounds."""
    out = []
    for rows in sorted({k["rows"] for k in wake["keepup"]}):
        alone = [k for k in wake["keepup"] if k["rows"] == rows and not k["consumer"] and "error" not in k]
        withc = [k for k in wake["keepup"] if k["rows"] == rows and k["consumer"] and "error" not in k]
        max_rate = _median(k["events_per_s"] for k in alone)
        delivered = _median(k.get("delivered_per_s") for k in withc)
        out.append({"rows": rows, "rounds": len(withc), "max_rate": max_rate,
                    "with_rate": _median(k["events_per_s"] for k in withc),
                    "delivered": delivered,
                    "share": delivered / max_rate if delivered and max_rate else None,
                    "lag_p50": _median(k.get("lag_p50_ms") for k in withc),
                    "lag_p99": _median(k.get("lag_p99_ms") for k in withc),
                    "wakeups_per_batch": _median(k.get("wakeups_per_batch") for k in withc),
                    "skipped": sum(k.get("skipped") or 0 for k in withc),
                    "errors": sorted({e for k in wake["keepup"] if k["rows"] == rows
                                      for e in k.get("errors", []) + ([k["error"]] if "error" in k else [])})})
    return out


def _cfg(c):
    """A cell's producer configuration: 8 × 1-row, 0–5 ms."""
    return f"{c['producers']} × {c['rows']}-row, 0–{c['delay']:g} ms"


def wake_goals(wake):
    """The wake-up goals for (d), read off this run: (goal, measured, met)."""
    cells = wake_cells(wake)
    by = {(c["scenario"], c["producers"], c["rows"], c["delay"], c["kind"]): c for c in cells}
    wf = [c for c in cells if c["kind"] == "wait_for" and c["scenario"] == "steady"]
    goals = []

    def worst(field, cs):
        # The wake-up alone is only measured by waits nothing pending could
        # end; at high commit rates too few of those qualify to mean much.
        cs = [c for c in cs if not field.startswith("wake_") or (c["wake_n"] or 0) >= WAKE_MIN_WAITS]
        vals = [(c[field], c) for c in cs if c[field] is not None]
        return max(vals, key=lambda v: v[0]) if vals else (None, None)

    for name, field, limit in (("lag p50 ≤ 0.5 ms above the row's own commit", "lag_p50_ms", 0.5),
                               ("lag p99 ≤ 5 ms above the row's own commit", "lag_p99_ms", 5.0),
                               ("in-order lag p50 ≤ 0.5 ms (after the row and every smaller key committed)",
                                "inorder_p50_ms", 0.5),
                               ("in-order lag p99 ≤ 5 ms", "inorder_p99_ms", 5.0),
                               ("the wake-up alone p50 ≤ 0.5 ms (commit → wait_for returns; "
                                f"configurations with ≥ {WAKE_MIN_WAITS} qualifying waits)",
                                "wake_p50_ms", 0.5),
                               ("the wake-up alone p99 ≤ 5 ms", "wake_p99_ms", 5.0)):
        v, c = worst(field, wf)
        if v is not None:
            shown = [x for x in wf if not field.startswith("wake_")
                     or (x["wake_n"] or 0) >= WAKE_MIN_WAITS]
            goals.append((name, f"worst {v:.2f} ms ({_cfg(c)}); all: "
                          + ", ".join(f"{_cfg(x)} {fmt(x[field])}" for x in shown),
                          v <= limit))
    for field, what in (("lag_p50_ms", "lag from own commit"), ("inorder_p50_ms", "lag in order"),
                        ("wake_p50_ms", "the wake-up alone")):
        ratios = []
        for c in wf:
            n = by.get(("steady", c["producers"], c["rows"], c["delay"], "notify"))
            if field.startswith("wake_") and min((c["wake_n"] or 0), (n or {}).get("wake_n") or 0) \
                    < WAKE_MIN_WAITS:
                continue
            if n and n[field] and c[field]:
                ratios.append((n[field] / c[field], c))
        if ratios:
            v, c = min(ratios, key=lambda x: x[0])
            goals.append((f"p50 ≥ 5× lower than LISTEN/NOTIFY ({what})",
                          f"lowest {v:.1f}× ({_cfg(c)}); all: "
                          + ", ".join(f"{_cfg(x)} {r:.1f}×" for r, x in ratios),
                          v >= 5.0))
    for p in wake_pairs(wake):
        want = {"1-same": 0.97, "100-same": 0.97, "100-other": 0.95}.get(p["condition"])
        if want and p["ratio"] is not None:
            what = {"1-same": "producers with 1 consumer waiting on their table",
                    "100-same": f"producers with {p['waiters']} consumers waiting on their table",
                    "100-other": f"producers with {p['waiters']} consumers waiting on another table"}
            goals.append((f"{what[p['condition']]} ≥ {want:.2f}× of none waiting",
                          f"{p['ratio']:.3f}× (median of {p['rounds']} rounds, "
                          f"{fmt(p['min'], '{:.3f}')}–{fmt(p['max'], '{:.3f}')})", p["ratio"] >= want))
    for k in wake_keepup(wake):
        floor = 5000 if k["rows"] == 1 else 25000
        if k["share"] is not None:
            goals.append((f"keeps up with ≥ 95% of the producers' maximum rate, {k['rows']}-row "
                          f"transactions (≥ {floor:,} events/s)",
                          f"delivered {k['delivered']:,.0f}/s of {k['max_rate']:,.0f} = {k['share']:.0%}",
                          k["share"] >= 0.95 and k["delivered"] >= floor))
    wpb = [c["wakeups_per_batch"] for c in cells if c["kind"] == "wait_for" and c["wakeups_per_batch"] is not None]
    if wpb:
        goals.append(("≤ 1 wake-up query per delivered batch", f"at most {max(wpb):.3f}", max(wpb) <= 1.0 + 1e-9))
    if cells or wake["keepup"]:
        skipped = sum(c["skipped"] or 0 for c in cells) + sum(k["skipped"] for k in wake_keepup(wake))
        goals.append(("zero skipped rows (every consumer kind)", f"{skipped:,} skipped", skipped == 0))
    idle = [c for c in cells if c["kind"] == "wait_for" and c["scenario"] == "idle-in-tx"]
    if idle:
        parts, ok = [], True
        for c in idle:
            s = by.get(("steady", c["producers"], c["rows"], c["delay"], "wait_for"))
            if not s:
                continue
            parts.append(f"{_cfg(c)}: p50 {fmt(c['lag_p50_ms'])} vs "
                         f"{fmt(s['lag_p50_ms'])}, p99 {fmt(c['lag_p99_ms'])} vs {fmt(s['lag_p99_ms'])} ms, "
                         f"skipped {c['skipped']}")
            ok &= (c["skipped"] == 0 and c["lag_p99_ms"] is not None and s["lag_p99_ms"] is not None
                   and c["lag_p99_ms"] <= 2 * s["lag_p99_ms"] + 1)
        goals.append(("an idle-in-transaction session changes none of it (idle vs steady: no skip, "
                      "lag p99 within 2× + 1 ms; the horizon workaround's failure is no delivery at all)",
                      "; ".join(parts), ok))
    return goals


def wake_markdown(wake):
    cfg = wake.get("config") or {}
    out = ["## wake-ups: consumers side by side", ""]
    if wake.get("pgq_missing") and wake["cells"]:
        out += [f"**PgQ left out**: {wake['pgq_missing']}.", ""]
    if not cfg:
        return out + ["(no part of the wake workload ran)", ""]
    cells = wake_cells(wake)
    if cells:
        out += [
            f"pgbench producers insert into a latched gapless table (`pgkvx.next_key` ids), "
            f"1 or 10 rows per transaction, sleeping uniform 0–5 ms (or 0) inside it "
            f"before COMMIT, for {cfg['duration']:g} s per cell; one consumer at a time tails the "
            f"stream, LIMIT {cfg['limit']}; {cfg['reps']} repetition(s), kinds interleaved. "
            "Lag: the server's commit timestamp of the row's transaction "
            "(track_commit_timestamp) → the consumer's read returned (wall clock, same machine). "
            "In-order lag: from when the row and every smaller key had committed, the earliest a "
            "consumer in key order may deliver it. Rates over the first-to-last commit window. "
            "Skipped: committed ids never delivered (exact: every id in the table at the end). "
            "Wake-up queries/batch: `wait_for` calls that returned true per non-empty read "
            "(calls that timed out, with nothing committed, in brackets). Woke ms: for each wait "
            "of the consumer (sleep, NOTIFY, wait_for) that began with nothing committed since "
            "its read began and during which a transaction committed, how long after that commit "
            "the wait ended: the wake-up alone (how many waits qualified in brackets). Read ms: how "
            "long the consumer's reads that returned rows took (PgQ: its three calls).", "",
            "| scenario | producers × rows/tx, commit delay | consumer | producer commits/s | events/s "
            "| rows/s delivered | lag p50 ms | lag p99 ms | lag max ms | in-order p50 ms "
            "| in-order p99 ms | woke ms p50 / p99 (waits) | read ms p50 / p99 | queries/row "
            "| wake-up queries/batch | skipped | errors |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
            "| ---: | ---: | ---: | ---: |",
        ]
    for c in cells:
        skipped = "–" if c["skipped"] is None else f"{c['skipped']:,} of {c['committed']:,}"
        if c["phantoms"] or c["duplicates"]:
            skipped += f" (+{c['phantoms']} phantom, {c['duplicates']} twice)"
        if c["timed_out"]:
            skipped += " (drain timed out)"
        wpb = (fmt(c["wakeups_per_batch"], "{:.3f}") + f" ({c['wait_timeouts']} timed out)"
               if c["kind"] == "wait_for" else "–")
        out.append(f"| {c['scenario']} | {_cfg(c)} | {c['label']} | "
                   f"{fmt_tps(c['producer_tps'])} | {fmt_tps(c['events_per_s'])} | "
                   f"{fmt_tps(c['delivered_per_s'])} | {fmt(c['lag_p50_ms'])} | {fmt(c['lag_p99_ms'])} | "
                   f"{fmt(c['lag_max_ms'])} | {fmt(c['inorder_p50_ms'])} | {fmt(c['inorder_p99_ms'])} | "
                   f"{fmt(c['wake_p50_ms'])} / {fmt(c['wake_p99_ms'])} ({fmt(c['wake_n'], '{:,.0f}')}) | "
                   f"{fmt(c['read_p50_ms'])} / {fmt(c['read_p99_ms'])} | "
                   f"{fmt(c['queries_per_row'], '{:.3f}')} | {wpb} | {skipped} | {len(c['errors'])} |")
    if cells:
        out.append("")
    pairs = wake_pairs(wake)
    if pairs:
        out += [
            "### Producers with consumers waiting", "",
            f"Two tables written at the same time, {cfg['pair_producers']} pgbench clients each at "
            f"full speed (one row per transaction, no commit delay), for {cfg['pair_duration']:g} s; "
            "the waiters are pgbench clients tailing one side's table (the sides swap every round) "
            "with a LIMIT read and `pgkvx.wait_for`, or waiting on a third table nobody writes. "
            "Ratio: tps of the side with waiters ÷ the other side, same run (for the control, "
            "side A ÷ side B; for another table: both sides' total ÷ the control run of the same "
            "round). Median over rounds.", "",
            "| condition | rounds | ratio (median) | min–max | tps, side with waiters | tps, other side "
            "| total tps | waiters' wait_for calls |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        text = dict(PAIR_TEXT)
        for p in pairs:
            out.append(f"| {text.get(p['condition'], p['condition']).format(n=p['waiters'])} | "
                       f"{p['rounds']} | {fmt(p['ratio'], '{:.3f}')}× | "
                       f"{fmt(p['min'], '{:.3f}')}–{fmt(p['max'], '{:.3f}')} | {fmt_tps(p['tps_a'])} | "
                       f"{fmt_tps(p['tps_b'])} | {fmt_tps(p['total'])} | {fmt_tps(p['waiter_calls'])} |")
        out.append("")
    keep = wake_keepup(wake)
    if keep:
        out += [
            "### Keeping up with producers at full speed", "",
            f"{cfg['keepup_producers']} pgbench clients with no commit delay, alone (their "
            f"maximum rate) and with one `wait_for` consumer reading LIMIT {cfg['keepup_limit']}, "
            f"{cfg['keepup_duration']:g} s each, medians over rounds.", "",
            "| rows/tx | rounds | max rate, events/s (alone) | events/s with the consumer "
            "| rows/s delivered | delivered ÷ max rate | lag p50 ms | lag p99 ms "
            "| wake-up queries/batch | skipped |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for k in keep:
            out.append(f"| {k['rows']} | {k['rounds']} | {fmt_tps(k['max_rate'])} | "
                       f"{fmt_tps(k['with_rate'])} | {fmt_tps(k['delivered'])} | "
                       f"{fmt(k['share'], '{:.1%}')} | {fmt(k['lag_p50'])} | {fmt(k['lag_p99'])} | "
                       f"{fmt(k['wakeups_per_batch'], '{:.3f}')} | {k['skipped']:,} |")
        out.append("")
    goals = wake_goals(wake) if cells or pairs or keep else []
    if goals:
        out += ["### Wake-up goals for (d), in this run", "",
                "Read off the tables above; the harness reports, it asserts nothing.", "",
                "| goal | measured | |", "| --- | --- | --- |"]
        out += [f"| {g} | {m} | {'met' if ok else '**missed**'} |" for g, m, ok in goals]
        out.append("")
    problems = [f"{c['scenario']} {_cfg(c)} {c['label']}: `{e}`"
                for c in cells for e in c["errors"]]
    problems += [f"pair {p['condition']}: `{e}`" for p in pairs for e in p["errors"]]
    problems += [f"keep-up {k['rows']}-row: `{e}`" for k in keep for e in k["errors"]]
    if problems:
        out += ["### Errors reported by the wake runs", ""] + [f"- {x}" for x in problems] + [""]
    return out


PAIR_TEXT = [("none", "nobody waiting (control)"), ("1-same", "1 waiting on the table"),
             ("100-same", "{n} waiting on the table"), ("100-other", "{n} waiting on another table")]


def wake_chart(ax50, ax99, wake, cfgs):
    cells = [c for c in wake_cells(wake) if c["scenario"] == "steady"]
    kinds = [k for k in WAKE_LABELS if any(c["kind"] == k for c in cells)]
    labels = [WAKE_LABELS[k] for k in kinds]
    groups = [_cfg({"producers": p, "rows": r, "delay": d}) for p, r, d in cfgs]
    for ax, field, other, title in (
            (ax50, "lag_p50_ms", "inorder_p50_ms",
             "wake-ups: lag p50, commit → delivery (labels: in-order p50)"),
            (ax99, "lag_p99_ms", "skipped",
             "wake-ups: lag p99, commit → delivery (labels: rows never delivered)")):
        vals = {(_cfg(c), c["label"]): c[field] for c in cells if c[field]}
        ann = {(_cfg(c), c["label"]):
               (fmt(c[other]) if other != "skipped" else
                (None if c["skipped"] is None else f"{c['skipped']:,}")) for c in cells}
        _grouped_bars(ax, groups, labels, vals, ann)
        ax.set_xticklabels(groups, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms (log)")
        ax.set_title(title)


def render(json_path):
    """Writes the .md and .png next to the .json; returns their paths."""
    with open(json_path) as f:
        result = json.load(f)
    base = json_path[:-len(".json")]
    with open(base + ".md", "w") as f:
        f.write(markdown(result))
    chart(result, base + ".png")
    return base + ".md", base + ".png"


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].endswith(".json"):
        sys.exit("usage: report.py RUN.json")
    print("\n".join(render(sys.argv[1])))
