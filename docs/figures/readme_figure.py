"""Draw the README's figure, docs/figures/readme.png (about 20 s on 2 cores):

    python docs/figures/readme_figure.py

MARINA with PermK against MARINA with RandK(1) — the same bits per message — on the paper's
synthetic quadratic with 1,000 workers whose functions are alike, each at its theory step size.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import permk  # noqa: E402

q = permk.Quadratic.synthetic(n=1000, d=1000, lam=1e-6, noise_scale=0.05, seed=0)
fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=100)
for label, c in (("MARINA + PermK", permk.PermK()), ("MARINA + RandK(1)", permk.RandK(1))):
    r = permk.marina(q, c, rounds=4000, seed=1)
    ax.semilogy(r.bits_per_worker / 1000, r.grad_norm_sq, label=label)
ax.set_xlabel("kbit sent per worker (the drops: MARINA's full-gradient rounds)")
ax.set_ylabel("‖∇f(x)‖²")
ax.set_title(f"1,000 workers with similar functions (d = 1,000, L± = {q.L_pm:.2f}), theory step sizes", fontsize=10)
ax.legend()
fig.tight_layout()
fig.savefig(Path(__file__).resolve().parent / "readme.png")
