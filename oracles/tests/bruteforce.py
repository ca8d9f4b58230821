"""An independent scalar-loop attention, for checking the oracles on tiny shapes.

Plain Python floats and the math module, one loop per index, the visibility rule written from
the contract's words: nothing here is shared with oracles.dense_reference.
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


def _row(q_vec, pairs, scale, sink, dv):
    """One query row of one head: pairs [(k_vec, v_vec)] of the keys it sees -> (o, lse)."""
    terms = [(scale * sum(a * b for a, b in zip(q_vec, k_vec)), v_vec) for k_vec, v_vec in pairs]
    if sink is not None:
        terms.append((sink, None))
    if not terms or max(t for t, _ in terms) == -math.inf:
        return [0.0] * dv, -math.inf
    top = max(t for t, _ in terms)
    total = sum(math.exp(t - top) for t, _ in terms)
    o = [0.0] * dv
    for logit, v_vec in terms:
        if v_vec is not None:
            o = [acc + math.exp(logit - top) / total * x for acc, x in zip(o, v_vec)]
    return o, top + math.log(total)


def sparse_attention(q, scopes, scale=None, sink=None):
    """q [b][t][h][d]; scopes [(k_cache, v_cache, indices, topk_len)] with caches
    [block][offset][h][d], indices [b][t][i] of slots block * block_size + offset (-1: none),
    topk_len [b] or None. Returns (o [b][t][h][d], lse [b][h][t])."""
    B, T, Hq, D = len(q), len(q[0]), len(q[0][0]), len(q[0][0][0])
    scale = 1 / math.sqrt(D) if scale is None else scale
    dv = len(scopes[0][1][0][0][0])
    o = [[[None] * Hq for _ in range(T)] for _ in range(B)]
    lse = [[[0.0] * T for _ in range(Hq)] for _ in range(B)]
    for b in range(B):
        for i in range(T):
            for h in range(Hq):
                pairs = []
                for k_cache, v_cache, indices, topk_len in scopes:
                    block_size, Hkv = len(k_cache[0]), len(k_cache[0][0])
                    kv_head = h // (Hq // Hkv)
                    for n, slot in enumerate(indices[b][i]):
                        if slot == -1 or (topk_len is not None and n >= topk_len[b]):
                            continue
                        block, offset = slot // block_size, slot % block_size
                        pairs.append((k_cache[block][offset][kv_head], v_cache[block][offset][kv_head]))
                o[b][i][h], lse[b][h][i] = _row(q[b][i][h], pairs, scale, None if sink is None else sink[h], dv)
    return o, lse


def paged_attention(q, k_cache, v_cache, block_table, kv_lens, cu_seqlens_q=None, scale=None, causal=False,
                    window=None, sink=None):
    """q [b][t][h][d], or packed [row][h][d] with cu_seqlens_q [b + 1]; caches
    [block][offset][h][d]; logical key j of request b in block block_table[b][j // block_size]
    at offset j % block_size. Returns (o, lse) shaped like q: [b][t][h][d] and [b][h][t], or
    [row][h][d] and [h][row]."""
    block_size, Hkv, D, dv = len(k_cache[0]), len(k_cache[0][0]), len(k_cache[0][0][0]), len(v_cache[0][0][0])
    requests = q if cu_seqlens_q is None else [q[s:e] for s, e in zip(cu_seqlens_q, cu_seqlens_q[1:])]
    Hq = len(q[0]) if cu_seqlens_q is not None else len(q[0][0])
    scale = 1 / math.sqrt(D) if scale is None else scale
    o_requests, lse_requests = [], []
    for b, q_b in enumerate(requests):
        T, S = len(q_b), kv_lens[b]
        o_b, lse_b = [[None] * Hq for _ in range(T)], [[0.0] * T for _ in range(Hq)]
        for i in range(T):
            position = S - T + i
            for h in range(Hq):
                kv_head = h // (Hq // Hkv)
                pairs = []
                for j in range(S):
                    if (causal or window is not None) and j > position:
                        continue
                    if window is not None and j <= position - window:
                        continue
                    block, offset = block_table[b][j // block_size], j % block_size
                    pairs.append((k_cache[block][offset][kv_head], v_cache[block][offset][kv_head]))
                o_b[i][h], lse_b[h][i] = _row(q_b[i][h], pairs, scale, None if sink is None else sink[h], dv)
        o_requests.append(o_b)
        lse_requests.append(lse_b)
    if cu_seqlens_q is None:
        return o_requests, lse_requests
    return [row for o_b in o_requests for row in o_b], [sum((l[h] for l in lse_requests), []) for h in range(Hq)]
