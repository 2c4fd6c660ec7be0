"""Turns the soak benchmark's per-second samples into per-phase and overall figures; prints them.

Slopes are least squares over the steady part of a phase (x in minutes, y in KiB or ms), each with
its standard error; "across rounds" fits the steady parts of every phase at one load level, so it
spans the whole run at equal load.
"""

import os
import platform

import soak_stats as st


def machine_info():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "kernel": platform.release(),
            "load1_start": st.read_loadavg()}


def _fit(samples, get):
    pts = [(s["t"] / 60, get(s)) for s in samples]
    pts = [(x, y) for x, y in pts if y is not None]
    b, se = st.slope([x for x, _ in pts], [y for _, y in pts])
    return {"slope": b, "se": se, "n": len(pts)}


def _rss(i):
    """Getter of the RSS of process i (-1: the collector, else agent i)."""
    if i < 0:
        return lambda s: s["collector"]["rss_kib"]
    return lambda s: s["agents"][i]["rss_kib"] if i < len(s["agents"]) else None


def _delta(first, last, get):
    a, b = get(first), get(last)
    return None if a is None or b is None else b - a


def _agents_sum(key):
    def get(s):
        values = [a.get(key) for a in s["agents"]]
        return None if any(v is None for v in values) else sum(values)
    return get


def _per_1k(cpu_s, events):
    return cpu_s * 1e3 / (events / 1e3) if cpu_s is not None and events else None


def _growing(fit, threshold):
    return (fit["slope"] is not None and fit["slope"] > threshold
            and fit["slope"] > 3 * (fit["se"] or 0))


def _phase_figures(args, phase, samples, jobs, n_agents):
    ps = [s for s in samples if s["phase"] == phase["index"]]
    if len(ps) < 2:
        return dict(phase, samples=len(ps))
    steady_from = phase["start"] + args.warmup * (phase["end"] - phase["start"])
    steady = [s for s in ps if s["t"] >= steady_from]
    first, last = ps[0], ps[-1]
    dt = last["t"] - first["t"]
    coll_cpu = _delta(first, last, lambda s: s["collector"]["cpu_s"])
    agents_cpu = _delta(first, last, _agents_sum("cpu_s"))
    counted = _delta(first, last, lambda s: s.get("steps_received"))
    agents_recv = _delta(first, last, _agents_sum("received"))
    busy = _delta(first, last, lambda s: s["sys_busy"])
    total = _delta(first, last, lambda s: s["sys_total"])
    mine = [j for j in jobs if j["phase"] == phase["index"] and j["result"]]
    scrape = [s["scrape_ms"] for s in ps if "scrape_ms" in s]
    ctl = [s["ctl_ms"] for s in ps if "ctl_ms" in s]
    agent_fits = [_fit(steady, _rss(i)) for i in range(n_agents)]
    f = dict(phase)
    f.update({
        "samples": len(ps),
        "steady_samples": len(steady),
        "target_events_per_s": args.slots * phase["world_size"] * phase["steps_per_s"],
        "events_per_s": counted / dt if counted is not None and dt > 0 else None,
        "jobs_started": len([j for j in jobs if j["phase"] == phase["index"]]),
        "jobs_finished": _delta(first, last, lambda s: s.get("jobs_finished")),
        "clients_sent": sum(j["result"].get("sent", 0) for j in mine),
        "clients_dropped": sum(j["result"].get("dropped", 0) for j in mine),
        "collector_rss_mib": st.mean([s["collector"]["rss_kib"] for s in steady
                                      if s["collector"]["rss_kib"]]) / 1024 if steady else None,
        "collector_rss_slope": _fit(steady, _rss(-1)),
        "agents_rss_mib": [st.mean([y for y in (_rss(i)(s) for s in steady) if y]) / 1024
                           for i in range(n_agents)] if steady else [],
        "agents_rss_slope": agent_fits,
        "collector_cpu_pct": coll_cpu / dt * 100 if coll_cpu is not None and dt > 0 else None,
        "collector_cpu_ms_per_1k": _per_1k(coll_cpu, counted),
        "agents_cpu_pct": agents_cpu / dt * 100 / n_agents if agents_cpu is not None and dt > 0
        else None,
        "agents_cpu_ms_per_1k": _per_1k(agents_cpu, agents_recv),
        "machine_busy_pct": busy / total * 100 if total else None,
        "scrape_p50_ms": st.percentile(scrape, 50),
        "scrape_p99_ms": st.percentile(scrape, 99),
        "scrape_slope": _fit(steady, lambda s: s.get("scrape_ms")),
        "scrape_errors": len([s for s in ps if "scrape_error" in s]),
        "ctl_p50_ms": st.percentile(ctl, 50),
        "ctl_p99_ms": st.percentile(ctl, 99),
        "ctl_errors": len([s for s in ps if "ctl_error" in s]),
        "series_end": last.get("series"),
        "scrape_bytes_end": last.get("scrape_bytes"),
    })
    return f


def analyze(args, phases, samples, jobs):
    n_agents = len(samples[0]["agents"]) if samples else 0
    figures = [_phase_figures(args, p, samples, jobs, n_agents) for p in phases]
    thr = args.leak_kib_per_min
    settle = args.settle_rounds if args.rounds > args.settle_rounds else 0
    judged = [p for p in phases if p["round"] >= settle]
    judged_idx = {p["index"] for p in judged}
    steady = []
    for p in judged:
        steady_from = p["start"] + args.warmup * (p["end"] - p["start"])
        steady += [(p["level"], s) for s in samples
                   if s["phase"] == p["index"] and s["t"] >= steady_from]
    levels = []
    for level in range(args.phases):
        at = [s for lv, s in steady if lv == level]
        if not at:
            continue
        entry = {"level": level, "collector_rss_slope": _fit(at, _rss(-1)),
                 "agents_rss_slope": [_fit(at, _rss(i)) for i in range(n_agents)],
                 "scrape_slope": _fit(at, lambda s: s.get("scrape_ms")),
                 "series_slope": _fit(at, lambda s: s.get("series")),
                 "rounds": len({p["round"] for p in judged if p["level"] == level})}
        # Memory per finished job between the first and the last judged round at this level.
        rounds = sorted({p["round"] for p in judged if p["level"] == level})
        if len(rounds) > 1:
            def part(r):
                idx = {p["index"] for p in judged if p["level"] == level and p["round"] == r}
                return [s for s in at if s["phase"] in idx]
            a, b = part(rounds[0]), part(rounds[-1])
            if a and b:
                d_rss = st.mean([s["collector"]["rss_kib"] or 0 for s in b]) - \
                    st.mean([s["collector"]["rss_kib"] or 0 for s in a])
                d_jobs = st.mean([s.get("jobs_finished", 0) for s in b]) - \
                    st.mean([s.get("jobs_finished", 0) for s in a])
                entry["collector_kib_per_finished_job"] = d_rss / d_jobs if d_jobs else None
        levels.append(entry)

    last = samples[-1] if samples else {}
    first = samples[0] if samples else {}
    sent = sum(j["result"].get("sent", 0) for j in jobs if j["result"])
    counted = last.get("steps_received")
    totals = {
        "jobs_started": len(jobs),
        "jobs_finished": last.get("jobs_finished"),
        "jobs_left": last.get("jobs"),
        "clients_sent": sent,
        "clients_dropped": sum(j["result"].get("dropped", 0) for j in jobs if j["result"]),
        "clients_late_steps": sum(j["result"].get("late_steps", 0) for j in jobs if j["result"]),
        "agents_received": _agents_sum("received")(last) if last else None,
        "agents_rejected": _agents_sum("rejected")(last) if last else None,
        "agents_shipped": _agents_sum("shipped")(last) if last else None,
        "agents_dropped": _agents_sum("dropped")(last) if last else None,
        "collector_received": counted,
        "collector_rejected": last.get("steps_rejected"),
        "collector_duplicates": last.get("duplicates"),
        "lost": sent - counted if counted is not None else None,
        "transports": sorted({t for j in jobs if j["result"]
                              for t in j["result"].get("transport", [])}),
    }
    procs = [("collector", -1)] + [(f"agent-{i}", i) for i in range(n_agents)]
    memory = {}
    for name, i in procs:
        get = (lambda s: s["collector"]) if i < 0 else (lambda s, i=i: s["agents"][i])
        memory[name] = {"rss_start_mib": (get(first)["rss_kib"] or 0) / 1024 if first else None,
                        "rss_end_mib": (get(last)["rss_kib"] or 0) / 1024 if last else None,
                        "hwm_mib": (get(last)["hwm_kib"] or 0) / 1024 if last else None,
                        "whole_run_slope": _fit(samples, _rss(i))}
    flags = []
    for name, i in procs:
        for lv in levels:
            fit = lv["collector_rss_slope"] if i < 0 else lv["agents_rss_slope"][i]
            if lv["rounds"] > 1 and _growing(fit, thr):
                flags.append(f"{name}: RSS grows {fit['slope']:.0f} +- {fit['se']:.0f} KiB/min "
                             f"across {lv['rounds']} rounds at load level {lv['level']}")
        grow = [f for f in figures if "collector_rss_slope" in f and f["index"] in judged_idx
                and _growing(f["collector_rss_slope"] if i < 0 else f["agents_rss_slope"][i],
                             thr)]
        if len(grow) * 2 >= len(judged) and grow:
            flags.append(f"{name}: RSS grows within {len(grow)} of {len(judged)} phases "
                         f"(slope > {thr:g} KiB/min and > 3 standard errors)")
    scrape_all = [s["scrape_ms"] for s in samples if "scrape_ms" in s]
    # CPU against event rate over the phases: the slope is the cost of one more event, the
    # intercept the fixed cost (ticks, NVML reads, batches, scrapes).
    cpu = {}
    for key, scale in (("collector", 1), ("agents", n_agents)):
        pts = [(f["events_per_s"], f[f"{key}_cpu_pct"] * scale) for f in figures
               if f.get("events_per_s") and f.get(f"{key}_cpu_pct") is not None]
        b, se = st.slope([x for x, _ in pts], [y for _, y in pts])
        if b is not None:
            mx = st.mean([x for x, _ in pts])
            my = st.mean([y for _, y in pts])
            cpu[key] = {"marginal_ms_per_1k": b / 100 * 1e6, "se": se / 100 * 1e6,
                        "fixed_pct": my - b * mx}
    return {"config": {k: v for k, v in vars(args).items() if k not in ("json",)},
            "phase_seconds": phases[0]["end"] - phases[0]["start"] if phases else None,
            "phases": figures, "levels": levels, "totals": totals, "memory": memory,
            "scrape_p50_ms": st.percentile(scrape_all, 50),
            "scrape_p99_ms": st.percentile(scrape_all, 99),
            "cpu_fit": cpu, "judged_rounds": f"{settle}..{args.rounds - 1}",
            "leak_flags": flags}


def _n(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)


def _sl(fit):
    if not fit or fit.get("slope") is None:
        return "-"
    return f"{fit['slope']:+.0f}±{fit['se']:.0f}"


def print_summary(summary, out):
    c = summary["config"]
    m = summary.get("machine", {})
    w = out.write
    w(f"\nstepwatch soak: {c['duration']:.0f} s, {c['phases']} load levels x {c['rounds']} rounds "
      f"({summary['phase_seconds']:.1f} s each, steady part after {c['warmup']:.0%}), "
      f"{c['agents']} agents ({c['gpus']} fake GPUs each, --interval={c['interval']:g}, "
      f"{'no spool' if c.get('no_spool') else 'with --spool-dir'}), "
      f"{c['slots']} jobs at once, {c['job_seconds']:g} s each\n")
    w(f"machine: {m.get('cpus')} CPUs ({m.get('cpu_model')}), load average "
      f"{_n(m.get('load1_start'), '{:.2f}')} at start, "
      f"{_n(m.get('load1_end'), '{:.2f}')} at end\n\n")
    w("RSS (MiB over the steady part; slope KiB/min ± standard error)\n")
    w(f"{'ph':>2} {'rd':>2} {'lvl':>3} {'ranks':>5} {'st/s':>4} {'ev/s':>6} {'meas':>6} "
      f"{'jobs':>4} {'coll MiB':>8} {'coll slope':>11} {'agent MiB':>9} "
      f"{'agent slopes (max)':>18}\n")
    for f in summary["phases"]:
        if "collector_rss_slope" not in f:
            continue
        slopes = [a for a in f["agents_rss_slope"] if a["slope"] is not None]
        worst = max(slopes, key=lambda a: a["slope"]) if slopes else None
        w(f"{f['index']:>2} {f['round']:>2} {f['level']:>3} {f['world_size']:>5} "
          f"{f['steps_per_s']:>4g} {f['target_events_per_s']:>6.0f} "
          f"{_n(f['events_per_s'], '{:.0f}'):>6} {f['jobs_started']:>4} "
          f"{_n(f['collector_rss_mib']):>8} {_sl(f['collector_rss_slope']):>11} "
          f"{_n(st.mean(f['agents_rss_mib'])):>9} {_sl(worst):>18}\n")
    w("\nCPU and latency (CPU % of one core; ms of CPU per 1,000 events; "
      "agents: mean % per agent)\n")
    w(f"{'ph':>2} {'coll %':>6} {'ms/1k':>6} {'agent %':>7} {'ms/1k':>6} {'mach %':>6} "
      f"{'scrape p50':>10} {'p99':>6} {'slope ms/min':>12} {'ctl p50':>7} {'p99':>6} "
      f"{'series':>6} {'sent':>7} {'cl.drop':>7}\n")
    for f in summary["phases"]:
        if "collector_rss_slope" not in f:
            continue
        w(f"{f['index']:>2} {_n(f['collector_cpu_pct']):>6} {_n(f['collector_cpu_ms_per_1k']):>6} "
          f"{_n(f['agents_cpu_pct']):>7} {_n(f['agents_cpu_ms_per_1k']):>6} "
          f"{_n(f['machine_busy_pct'], '{:.0f}'):>6} {_n(f['scrape_p50_ms']):>10} "
          f"{_n(f['scrape_p99_ms']):>6} {_sl(f['scrape_slope']):>12} {_n(f['ctl_p50_ms']):>7} "
          f"{_n(f['ctl_p99_ms']):>6} {_n(f['series_end'], '{:.0f}'):>6} {f['clients_sent']:>7} "
          f"{f['clients_dropped']:>7}\n")
    for key, fit in summary["cpu_fit"].items():
        w(f"{key}: {fit['marginal_ms_per_1k']:.1f} ± {fit['se']:.1f} ms of CPU per 1,000 more "
          f"events (fit over the phases), fixed {fit['fixed_pct']:.2f}% of a core"
          f"{' (all agents)' if key == 'agents' else ''}\n")
    w(f"\nAcross rounds {summary['judged_rounds']} at equal load (steady parts of those rounds' "
      "phases at the level)\n")
    w(f"{'lvl':>3} {'coll slope KiB/min':>18} {'KiB/finished job':>16} "
      f"{'agent slopes KiB/min':>40} {'scrape ms/min':>13} {'series/min':>10}\n")
    for lv in summary["levels"]:
        agents = " ".join(_sl(a) for a in lv["agents_rss_slope"])
        w(f"{lv['level']:>3} {_sl(lv['collector_rss_slope']):>18} "
          f"{_n(lv.get('collector_kib_per_finished_job')):>16} {agents:>40} "
          f"{_sl(lv['scrape_slope']):>13} {_sl(lv['series_slope']):>10}\n")
    w("\nMemory over the whole run (MiB)\n")
    for name, mem in summary["memory"].items():
        w(f"  {name:<10} start {_n(mem['rss_start_mib'])}, end {_n(mem['rss_end_mib'])}, "
          f"peak {_n(mem['hwm_mib'])}, whole-run slope {_sl(mem['whole_run_slope'])} KiB/min\n")
    t = summary["totals"]
    w(f"\nEvents: clients sent {t['clients_sent']} (dropped by clients {t['clients_dropped']}, "
      f"transport {','.join(t['transports']) or '-'}), agents received "
      f"{_n(t['agents_received'], '{:.0f}')} (rejected {_n(t['agents_rejected'], '{:.0f}')}, "
      f"dropped {_n(t['agents_dropped'], '{:.0f}')}), shipped {_n(t['agents_shipped'], '{:.0f}')}; "
      f"collector counted {_n(t['collector_received'], '{:.0f}')} "
      f"(rejected {_n(t['collector_rejected'], '{:.0f}')}); "
      f"lost end to end {_n(t['lost'], '{:.0f}')}\n")
    w(f"Jobs: {t['jobs_started']} started, {_n(t['jobs_finished'], '{:.0f}')} finished by the "
      f"collector, {_n(t['jobs_left'], '{:.0f}')} still tracked at the end\n")
    sd = summary.get("state_dir", {})
    w(f"Collector state dir at the end: {sd.get('scaling_history_job_names', '-')} job names in "
      f"scaling_history, {sd.get('reports', '-')} reports, dedupe journal "
      f"{_n(sd.get('dedupe_journal_bytes'), '{:.0f}')} bytes\n")
    twice = sd.get("jobs_finished_more_than_once") or []
    if twice and not c.get("name_pool"):  # with a name pool every name finishes many times
        w(f"Jobs the collector finished more than once: {len(twice)} ({', '.join(twice[:5])}"
          f"{', ...' if len(twice) > 5 else ''})\n")
    w(f"/metrics scrape over the run: p50 {_n(summary['scrape_p50_ms'])} ms, "
      f"p99 {_n(summary['scrape_p99_ms'])} ms\n")
    if summary["leak_flags"]:
        w("\nPOSSIBLE LEAKS:\n")
        for flag in summary["leak_flags"]:
            w(f"  {flag}\n")
    else:
        w(f"\nNo RSS growth above {c['leak_kib_per_min']:g} KiB/min at constant load.\n")
