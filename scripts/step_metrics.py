"""Print selected per-step metrics from a verl console log (the `step:N - key:value - ...` lines).

    python scripts/step_metrics.py runs/demo/train.log [more logs...]
"""

import re
import sys

KEYS = [("critic/score/mean", "reward"), ("actor/llds/penalty", "llds_pen"),
        ("actor/llds/gated_action_frac", "gated_act"), ("actor/llds/gated_response_frac", "gated_resp"),
        ("actor/pg_loss", "pg_loss"), ("actor/entropy", "entropy"), ("actor/grad_norm", "grad_norm"),
        ("search_r1/searches", "searches"), ("search_r1/answered", "answered"), ("response_length/mean", "resp_len")]
NUM = re.compile(r"^(?:np\.\w+\()?(-?[0-9.]+(?:e-?[0-9]+)?)\)?$")


def parse(path):
    steps = {}
    for line in open(path, errors="replace"):
        i = line.find("step:")
        if i < 0 or " - " not in line[i:]:
            continue
        fields = {}
        for part in line[i:].strip().split(" - "):
            k, _, v = part.partition(":")
            m = NUM.match(v.strip())
            if m:
                fields[k.strip()] = float(m.group(1))
        if "step" in fields:
            steps[int(fields["step"])] = fields
    return steps


def main(paths):
    steps = {}
    for p in paths:
        steps.update(parse(p))
    if not steps:
        print("no step metrics found in", ", ".join(paths))
        return 1
    print("step " + " ".join(f"{short:>10}" for _, short in KEYS))
    for n in sorted(steps):
        print(f"{n:>4} " + " ".join(f"{steps[n].get(k, float('nan')):>10.4g}" for k, _ in KEYS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
