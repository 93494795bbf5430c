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
    panels = (2 if result["kv"] else 0) + (1 if result["tail"] else 0)
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
