"""Print selected per-step metrics from a verl console log (the `step:N - key:value - ...` lines).

    python scripts/step_metrics.py runs/demo/train.log [more logs...]
    python -m train.main ... 2>&1 | tee train.log | python scripts/step_metrics.py --live [--steps N]
                                            # one line per step as training goes (the demo uses it)
"""

import re
import sys

KEYS = [("critic/score/mean", "reward"), ("val_em", "val_EM"), ("search_r1/searches", "searches"),
        ("search_r1/answered", "answered"), ("response_length/mean", "resp_len"),
        ("actor/llds/penalty", "llds_pen"), ("actor/llds/gated_action_frac", "gated_act"),
        ("actor/llds/logp_pos", "logp_pos"), ("search_r1/warning", "warning"),
        ("actor/pg_loss", "pg_loss"), ("actor/entropy", "entropy"), ("actor/grad_norm", "grad_norm")]
WINDOW = 3  # steps averaged at each end of the run for the rise
NUM = re.compile(r"^(?:np\.\w+\()?(-?[0-9.]+(?:e-?[0-9]+)?)\)?$")


def parse_line(line):
    """``{key: value}`` of one ``step:N - ...`` console line (None for any other line)."""
    i = line.find("step:")
    if i < 0 or " - " not in line[i:]:
        return None
    fields = {}
    for part in line[i:].strip().split(" - "):
        k, _, v = part.partition(":")
        m = NUM.match(v.strip())
        if m:
            fields[k.strip()] = float(m.group(1))
    if "step" not in fields:
        return None
    val = [v for k, v in fields.items() if k.startswith("val-core/") and "/reward/mean@" in k]
    if val:  # greedy EM on the validation file (the mean over its sources)
        fields["val_em"] = sum(val) / len(val)
    return fields


def parse(path):
    steps = {}
    for line in open(path, errors="replace"):
        fields = parse_line(line)
        if fields:
            steps.setdefault(int(fields["step"]), {}).update(fields)
    return steps


def live(lines, total=None, out=sys.stdout, clock=None):
    """Follow a training log: one line per step as it is logged (reward, searches, LLDS, the collapse warning,
    elapsed), and the trainer's collapse-warning lines."""
    import time

    clock = clock or time.monotonic
    start = clock()
    for line in lines:
        if "collapse warning:" in line:  # why a step is at WATCH or ALARM (train/trainer/ray_trainer.py)
            print(line[line.index("collapse warning:"):].rstrip(), file=out, flush=True)
            continue
        fields = parse_line(line)
        if not fields or "critic/score/mean" not in fields:
            continue
        s = int(clock() - start)
        parts = [f"step {int(fields['step'])}" + (f"/{total}" if total else ""),
                 f"reward {fields['critic/score/mean']:.2f}"]
        for key, name, fmt in (("search_r1/searches", "searches", ".2f"), ("actor/llds/penalty", "LLDS penalty", ".4f"),
                               ("actor/llds/gated_action_frac", "gated", ".2f"), ("val_em", "val EM", ".2f")):
            if key in fields:
                parts.append(f"{name} {fields[key]:{fmt}}")
        level = fields.get("search_r1/warning", 0)
        if level:  # the trainer's own "collapse warning: ..." line above names the signals
            parts.append("COLLAPSE ALARM" if level >= 2 else "watch")
        parts.append(f"elapsed {s // 60}m{s % 60:02d}s")
        print("  ".join(parts), file=out, flush=True)


def main(paths):
    steps = {}
    for p in paths:
        steps.update(parse(p))
    if not steps:
        print("no step metrics found in", ", ".join(paths))
        return 1
    print("step " + " ".join(f"{short:>10}" for _, short in KEYS))
    for n in sorted(steps):
        print(f"{n:>4} " + " ".join(f"{steps[n][k]:>10.4g}" if k in steps[n] else f"{'':>10}" for k, _ in KEYS))
    from train.toy.learnable_task import reward_rise

    if sum("critic/score/mean" in m for m in steps.values()) >= 2 * WINDOW:
        r = reward_rise(steps, WINDOW)
        print(f"reward: mean of the first {WINDOW} steps {r[0]:.3f}, of the last {WINDOW} steps {r[1]:.3f} "
              f"({r[1] - r[0]:+.3f})")
    return 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python scripts/step_metrics.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="*", help="verl console logs (the table of every step, and the reward rise)")
    ap.add_argument("--live", action="store_true", help="follow standard input: one line per step as it is logged")
    ap.add_argument("--steps", type=int, default=None, help="with --live: the run's number of steps (step N/STEPS)")
    args = ap.parse_args()
    if args.live:
        live(sys.stdin, args.steps)
        sys.exit(0)
    if not args.logs:
        ap.error("give a log, or --live to read standard input")
    sys.exit(main(args.logs))
