"""An independent scalar-loop attention, for checking the oracles on tiny shapes.

Plain Python floats and the math module, one loop per index, the visibility rule written from
the contract's words: nothing here is shared with oracles.reference.
"""

import math


def attention(q, k, v, scale=None, causal=False, window=None, sink=None):
    """q, k, v as nested lists [b][t][h][d]; returns (o [b][t][h][d], lse [b][h][t])."""
    B, T, Hq, D = len(q), len(q[0]), len(q[0][0]), len(q[0][0][0])
    S, Hkv, Dv = len(k[0]), len(k[0][0]), len(v[0][0][0])
    scale = 1 / math.sqrt(D) if scale is None else scale
    o = [[[[0.0] * Dv for _ in range(Hq)] for _ in range(T)] for _ in range(B)]
    lse = [[[0.0] * T for _ in range(Hq)] for _ in range(B)]
    for b in range(B):
        for h in range(Hq):
            kv_head = h // (Hq // Hkv)
            for i in range(T):
                position = S - T + i
                terms = []  # (logit, key index or None for the sink)
                for j in range(S):
                    if (causal or window is not None) and j > position:
                        continue
                    if window is not None and j <= position - window:
                        continue
                    dot = sum(q[b][i][h][d] * k[b][j][kv_head][d] for d in range(D))
                    terms.append((scale * dot, j))
                if sink is not None:
                    terms.append((sink[h], None))
                if not terms:
                    lse[b][h][i] = -math.inf
                    continue
                top = max(t for t, _ in terms)
                if top == -math.inf:
                    lse[b][h][i] = -math.inf
                    continue
                total = sum(math.exp(t - top) for t, _ in terms)
                lse[b][h][i] = top + math.log(total)
                for logit, j in terms:
                    if j is None:
                        continue
                    weight = math.exp(logit - top) / total
                    for d in range(Dv):
                        o[b][i][h][d] += weight * v[b][j][kv_head][d]
    return o, lse
