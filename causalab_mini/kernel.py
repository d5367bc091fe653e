"""The code that runs next to the weights: torch only, so a server with nothing of this project's can run it.

A request to a stock NDIF server (torch, transformers and nnsight; no causalab-mini, no nnterp) carries
this module's source by value (``engine/request.py`` ships it under a name no server has) and a program
as plain data: lists, dicts, numbers, strings and tensors. ``run(model, program)`` interprets the
program on the server's model; everything else — positions, metrics, outputs — stays the client's.

The arithmetic is also the package's own: the mechanisms (``ops/mechanisms.py``), the featurizers'
maps (``ops/featurizers.py``), gather/scatter's indexing (``ops/intervene.py``), the way a value sits
where nnsight hands it over (``engine/nnterp.py``), the write seam's order of operations
(``ops/intervene.apply_write``) and the built-in metric kinds (``metric_kinds.py``) are these
functions, so a remote write, and a remote score, is the local one to the bit.

nnsight 0.7.0 rebuilds a function shipped by value from its source, with its module's globals
re-imported by name, so this file keeps to what that rebuild reproduces (``tests/test_kernel.py``
lints it): ``import torch`` only; plain module-level functions (no classes, no decorators, no
nested functions or lambdas); no annotations and no ``from __future__`` (the rebuild compiles without
the flag); no module state but constants. It is one file, longer than this project's others, for the
same reason: a module shipped by value can import only what the server has, so the kernel cannot be
split into modules that import each other.
"""
import torch

# --- indexing: gather and scatter (the checks are the package's, ops/intervene.py) --------------------


def index_for(act, window, ragged, features):
    """Advanced-indexing tensors that take ``window`` (one tuple of positions per row) and the
    columns ``features`` (None: all) out of a ``(rows, seq, width)`` activation: ragged, every
    row's positions in row order, ``(total[, k])``; else ``(rows, w[, k])``."""
    rows = act.shape[0]
    device = act.device
    if ragged:
        row_idx = torch.tensor([r for r, ps in enumerate(window) for _ in ps], dtype=torch.long, device=device)
        pos_idx = torch.tensor([p for ps in window for p in ps], dtype=torch.long, device=device)
        if features is None:
            return (row_idx, pos_idx)
        cols = torch.tensor(tuple(features), dtype=torch.long, device=device)
        return (row_idx[:, None], pos_idx[:, None], cols[None, :])
    widths = {len(ps) for ps in window}
    w = widths.pop() if widths else 0
    row_idx = torch.arange(rows, dtype=torch.long, device=device)[:, None]
    pos_idx = torch.tensor([list(ps) for ps in window], dtype=torch.long, device=device).reshape(rows, w)
    if features is None:
        return (row_idx, pos_idx)
    cols = torch.tensor(tuple(features), dtype=torch.long, device=device)
    return (row_idx[:, :, None], pos_idx[:, :, None], cols[None, None, :])


def gather(act, window, ragged, features):
    return act[index_for(act, window, ragged, features)]


def scatter(act, window, value, ragged, features):
    """A copy of ``act`` with ``value`` at the window: never in place, which keeps autograd whole."""
    out = act.clone()
    out[index_for(act, window, ragged, features)] = value.to(device=act.device, dtype=act.dtype)
    return out


def select_features(f, features):
    """The coordinates ``features`` of the last axis of ``f``, in that order."""
    return f.index_select(f.dim() - 1, torch.as_tensor(tuple(features), dtype=torch.long, device=f.device))


def merge_features(f, sub, features):
    """``f`` with its coordinates ``features`` replaced by ``sub``, out of place (gradients reach both)."""
    index = torch.as_tensor(tuple(features), dtype=torch.long, device=f.device)
    return f.index_copy(f.dim() - 1, index, sub.to(f.dtype))


# --- the mechanisms: (f, operand, params, f0) -> f' over float32 feature values ------------------------


def as_operand(operand, f):
    # Called directly (tests, a hand-written plan) a mechanism may get a number.
    return torch.as_tensor(operand, dtype=f.dtype, device=f.device)


def swap(f, operand, params, f0=None):
    """The operand replaces f. ``expand`` + ``clone`` copies bits, so a swap of f with itself is exact."""
    return as_operand(operand, f).expand(f.shape).clone()


def add_scaled(f, operand, params, f0=None):
    return f + params.get("scale", 1.0) * as_operand(operand, f)


def lerp(f, operand, params, f0=None):
    """(1 − t)·f + t·operand, computed by ``torch.lerp``.

    ``torch.lerp`` evaluates ``f + t·(op − f)`` for t < ½ and ``op − (op − f)·(1 − t)``
    otherwise, so every t in between stays between the two. The ends are returned as
    they are rather than computed: the added zero term would turn −0.0 into +0.0, and
    "t = 1 is a swap, t = 0 is nothing" is meant to the bit.
    """
    t = float(params["t"])
    op = as_operand(operand, f).expand(f.shape)
    if t == 0.0:
        return f.clone()
    if t == 1.0:
        return op.clone()
    return torch.lerp(f, op, t)


def clamp(f, operand, params, f0=None):
    return torch.clamp(f, min=params.get("min"), max=params.get("max"))


def gaussian(f, operand, params, f0=None):
    """f + std·noise, the noise drawn on a CPU generator and then moved.

    Drawing on the CPU is what makes one seed one noise tensor on every device:
    CUDA's generator would give a different tensor for the same seed.
    """
    g = torch.Generator(device="cpu").manual_seed(int(params.get("seed", 0)))
    noise = torch.randn(tuple(f.shape), generator=g, dtype=torch.float32)
    return f + float(params["std"]) * noise.to(device=f.device, dtype=f.dtype)


def renormalize(f, operand, params, f0=None):
    """Rescale each position's vector to the L2 norm f0 had there: f·‖f0‖/‖f‖.

    A zero vector has no direction to rescale along and is returned as it is; the
    guard is on the denominator, not a ``where`` around the quotient, so no NaN
    reaches the backward either. The direction is found on f divided by its largest
    coordinate, then scaled: for a vector as short as the smallest normal float,
    ‖f0‖/‖f‖ overflows to inf and the squares inside ‖f‖ underflow to 0.
    """
    if f0 is None:
        raise ValueError("renormalize measures against the pre-write value f0, and none was given")
    peak = f.abs().amax(dim=-1, keepdim=True)
    unit = f / torch.where(peak > 0, peak, torch.ones_like(peak))  # coordinates in [-1, 1]
    norm = torch.linalg.vector_norm(unit, dim=-1, keepdim=True)
    target = torch.linalg.vector_norm(f0.to(f.dtype), dim=-1, keepdim=True)
    safe = torch.where(norm > 0, norm, torch.ones_like(norm))
    return (unit / safe) * target


MECHANISMS = ("swap", "add_scaled", "lerp", "clamp", "gaussian", "renormalize")


def mechanism(name):
    """A built-in mechanism's function by name (a dict made per call: the kernel keeps no module state)."""
    found = {"swap": swap, "add_scaled": add_scaled, "lerp": lerp, "clamp": clamp, "gaussian": gaussian,
             "renormalize": renormalize}.get(name)
    if found is not None:
        return found
    raise ValueError("kernel: unknown mechanism " + repr(name))


# --- the featurizers' maps ----------------------------------------------------------------------------
#
# Every kind returns the activation to the bit when the mechanism leaves the features alone:
# ``inverse`` adds the *change* in feature space, mapped back, to ``x`` — and where the change is
# exactly zero, x itself (not x + 0.0, which would turn a −0.0 into +0.0).


def on(t, like):
    return t if t.device == like.device else t.to(like.device)


def cayley(weight):
    """Q = (I − A)⁻¹ (I + A) E with A = W Eᵀ − E Wᵀ: a (d, k) orthonormal basis for every W.

    A has rank 2k (A = U Vᵀ with U = [W, −E], V = [E, W]), so the inverse is taken
    by Woodbury — (I − U Vᵀ)⁻¹ = I + U (I − Vᵀ U)⁻¹ Vᵀ — and the only system solved
    is 2k × 2k: O(d·k²) per access instead of a d × d solve. E (the first k columns
    of the identity) is never built: against it every product is a slice.
    In float64: the small solve's conditioning grows with W's norm, and a long fit that
    grows W would otherwise drift off orthonormality (|QᵀQ − I| ~ 1e-3 at column norm 100
    in float32; ~1e-12 here).
    """
    dtype = weight.dtype
    weight = weight.to(torch.float64)
    k = weight.shape[1]
    eye = torch.eye(k, dtype=weight.dtype, device=weight.device)
    top = weight[:k]  # Eᵀ W
    # (I + A) E = E + W − E (W[:k])ᵀ
    b = torch.cat([top + eye - top.T, weight[k:]], dim=0)
    # I − Vᵀ U, with Vᵀ U = [[W[:k], −I], [Wᵀ W, −W[:k]ᵀ]]
    inner = torch.cat([torch.cat([eye - top, eye], dim=1),
                       torch.cat([-(weight.T @ weight), eye + top.T], dim=1)], dim=0)
    rhs = torch.cat([b[:k], weight.T @ b], dim=0)  # Vᵀ b
    s = torch.linalg.solve(inner, rhs)
    q = b + weight @ s[:k]  # + U s = W s₁ − E s₂
    return torch.cat([q[:k] - s[k:], q[k:]], dim=0).to(dtype)


def basis_featurize(q, x):
    """A basis Q (d, k): f = x Q, and what it throws away, x − x Q Qᵀ."""
    q = on(q, x)
    f = x @ q
    return f, x - f @ q.T


def basis_inverse(q, f, x):
    q = on(q, x)
    delta = (f - x @ q) @ q.T
    return torch.where(delta == 0, x, x + delta)


def dictionary_encode(kind, w_enc, b_enc, b_dec, x):
    """An SAE (``sae``: ReLU) or linear dictionary: act((x − b_dec) W_enc + b_enc)."""
    pre = (x - on(b_dec, x)) @ on(w_enc, x) + on(b_enc, x)
    return torch.relu(pre) if kind == "sae" else pre


def dictionary_decode(w_dec, b_dec, f):
    return f @ on(w_dec, f) + on(b_dec, f)


def dictionary_inverse(decoded_new, decoded_x, x):
    """A dictionary write: x plus the change in what the dictionary explains, decode(f') − decode(encode(x))
    — what it does not explain stays as it was, however bad the reconstruction."""
    delta = decoded_new - decoded_x
    return torch.where(delta == 0, x, x + delta)


def hard_gate(theta, f, x):
    """A gate outside training: a mask θ > 0, f where it is on and x where it is off."""
    return torch.where(on(theta > 0, x), f, x)


def featurize(feat, x):
    """A featurizer held as data (``{"kind": …, tensors}``): (f, err)."""
    kind = feat["kind"]
    if kind == "identity" or kind == "gate":
        return x, None
    if kind == "subspace":
        return basis_featurize(cayley(feat["weight"]), x)
    if kind == "pca":
        return basis_featurize(feat["q"], x)
    if kind == "sae" or kind == "linear":
        f = dictionary_encode(kind, feat["w_enc"], feat["b_enc"], feat["b_dec"], x)
        return f, x - dictionary_decode(feat["w_dec"], feat["b_dec"], f)
    raise ValueError("kernel: unknown featurizer kind " + repr(kind))


def inverse(feat, f, err, x):
    kind = feat["kind"]
    if kind == "identity":
        return f
    if kind == "gate":
        return hard_gate(feat["theta"], f, x)
    if kind == "subspace":
        return basis_inverse(cayley(feat["weight"]), f, x)
    if kind == "pca":
        return basis_inverse(feat["q"], f, x)
    decode_x = dictionary_decode(feat["w_dec"], feat["b_dec"],
                                 dictionary_encode(kind, feat["w_enc"], feat["b_enc"], feat["b_dec"], x))
    return dictionary_inverse(dictionary_decode(feat["w_dec"], feat["b_dec"], f), decode_x, x)


# --- the write seam: inverse(do(featurize(x)), err, x) ---------------------------------------------------


def write(x32, featurize_fn, inverse_fn, do, operand_fn, params, f0_32, features, select, merge):
    """The seam's order of operations, on float32 values with autocast off (the caller's): featurize,
    the operand laid out against f (``operand_fn(f)``), f0 featurized, the mechanism on the selected
    coordinates (``features``; None: all), merged back, inverted. Returns the new x, float32.
    The three functions are callables (the package's featurizer objects) or bound kernel functions
    (a featurizer held as data: ``featurize_bound``)."""
    f, err = call(featurize_fn, (x32,))
    op = call(operand_fn, (f,))
    f0_f = None
    if f0_32 is not None:
        f0_f, _ = call(featurize_fn, (f0_32,))
    if features is None:
        new = do(f, op, params, f0_f)
    else:
        sub0 = None if f0_f is None else select(f0_f, features)
        new = merge(f, do(select(f, features), op, params, sub0), features)
    return call(inverse_fn, (new, err, x32))


def operand_tensor(operand, f, features):
    """An operand as a float32 tensor against ``f`` (its laying out was checked on the client)."""
    if operand is None:
        return None
    if isinstance(operand, float):
        return torch.tensor(operand, dtype=torch.float32, device=f.device)
    op = operand.to(device=f.device, dtype=torch.float32)
    if op.dim() == 0:
        return op
    if features is not None and op.shape[-1] == f.shape[-1]:
        op = select_features(op, features)
    return op


def conform(operand, x):
    """An operand read in the other layout than the write's (rectangular vs ragged), laid out as the
    write's positions; a published reduction (no row axis) broadcasts as it is."""
    if not isinstance(operand, torch.Tensor) or operand.dim() < 2 or operand.shape[:-1] == x.shape[:-1]:
        return operand
    lead = x.shape[:-1]
    if operand.shape[:-1].numel() != lead.numel():
        return operand
    return operand.reshape(*lead, operand.shape[-1])


def fires(op_step, step):
    """Whether an op fires at decode step ``step`` (None: a forward that does not decode): a
    prompt-frame op at the prefill (step 0), ``k`` at step k, ``all``/``stack`` at every step."""
    if step is None or op_step is None:
        return op_step is None and not step
    return op_step == "all" or op_step == "stack" or op_step == step


def last_window(act):
    """At a decode step, an op's window is the step's own position: the sequence axis's last index."""
    last = act.shape[1] - 1
    return tuple((last,) for _ in range(act.shape[0]))


def rows_of(act, rows):
    return act if rows is None else act[rows[0]:rows[1]]


def put_rows(act, rows, part):
    return torch.cat([act[:rows[0]], part, act[rows[1]:]], dim=0)


def unautocast(fn, args):
    """``fn(*args)`` with autocast off: a server may wrap a request in ``torch.autocast`` (NDIF
    does), and inside it half of a featurizer's arithmetic would come back downcast."""
    with torch.autocast(device_type="cpu", enabled=False):
        if torch.cuda.is_available():
            with torch.autocast(device_type="cuda", enabled=False):
                return fn(*args)
        return fn(*args)


# --- where a value is handed over, and how the activation sits in it --------------------------------------


def get_value(kind, value):
    """The ``(rows, seq, width)`` activation in what nnsight hands over at a point of ``kind``."""
    name = kind[0]
    if name == "first":  # a module output, element 0 of a tuple
        return value[0] if isinstance(value, tuple) else value
    if name == "itself":  # a module input
        return value
    if name == "logits":  # the model's output
        return value.logits
    if name == "pattern":  # (rows, heads, queries, keys) seen as (rows, queries, heads·keys)
        rows, heads, queries, keys = value.shape
        return value.transpose(1, 2).reshape(rows, queries, heads * keys)
    if name == "heads":  # argument kind[1] of a call, (rows, heads, seq, dim) seen as (rows, seq, heads·dim)
        x = value[0][kind[1]]
        rows, heads, seq, dim = x.shape
        return x.transpose(1, 2).reshape(rows, seq, heads * dim)
    raise ValueError("kernel: unknown value kind " + repr(kind))


def put_value(kind, value, new):
    """``value`` with its activation replaced by ``new`` (``get_value``'s inverse)."""
    name = kind[0]
    if name == "first":
        return (new, *value[1:]) if isinstance(value, tuple) else new
    if name == "itself":
        return new
    if name == "logits":
        value["logits"] = new  # a ModelOutput: item assignment sets the attribute too
        return value
    if name == "pattern":
        rows, heads, queries, keys = value.shape
        return new.reshape(rows, queries, heads, keys).transpose(1, 2)
    if name == "heads":
        args, kwargs = value
        i = kind[1]
        rows, heads, seq, dim = args[i].shape
        args = (*args[:i], new.reshape(rows, seq, heads, dim).transpose(1, 2), *args[i + 1:])
        return args, kwargs
    raise ValueError("kernel: unknown value kind " + repr(kind))


# --- the built-in metric kinds (metric_kinds.py's computes call these) -----------------------------------
# Each takes float32 logits (n, vocab) and one (n,) long id tensor per column, and returns (n,)
# float32 — normalized_effect also which rows are defined.


def pick(values, ids):
    return values.gather(-1, ids[:, None]).squeeze(-1)


def match(logits, expected):
    return (logits.argmax(dim=-1) == expected).float()


def logit_diff(logits, a, b):
    return pick(logits, a) - pick(logits, b)


def cross_entropy(logits, target):
    return -pick(logits.log_softmax(dim=-1), target)


def token_logit(logits, token):
    return pick(logits, token)


def token_prob(logits, token):
    return pick(logits.softmax(dim=-1), token)


def prob_diff(logits, a, b):
    probs = logits.softmax(dim=-1)
    return pick(probs, a) - pick(probs, b)


def token_rank(logits, token):
    return (logits > pick(logits, token)[:, None]).sum(dim=-1).float() + 1.0


def top_k(logits, expected, k):
    return ((logits > pick(logits, expected)[:, None]).sum(dim=-1) < k).float()


def kl_div(logits, reference):
    ref = reference.log_softmax(dim=-1)
    return (ref.exp() * (ref - logits.log_softmax(dim=-1))).sum(dim=-1)


def normalized_effect(logits, a, b, base, counterfactual, measure, min_denominator):
    m = logit_diff if measure == "logit_diff" else prob_diff
    low, high, here = m(base, a, b), m(counterfactual, a, b), m(logits, a, b)
    denominator = high - low
    defined = denominator.abs() >= min_denominator
    return (here - low) / denominator.where(defined, denominator.new_ones(())), defined


METRIC_KINDS = ("match", "logit_diff", "cross_entropy", "token_logit", "token_prob", "prob_diff", "token_rank",
                "top_k", "kl_div", "normalized_effect")


def metric_kind(name):
    """A built-in metric kind's compute by name."""
    if name not in METRIC_KINDS:
        raise ValueError("kernel: unknown metric kind " + repr(name))
    return {"match": match, "logit_diff": logit_diff, "cross_entropy": cross_entropy, "token_logit": token_logit,
            "token_prob": token_prob, "prob_diff": prob_diff, "token_rank": token_rank, "top_k": top_k,
            "kl_div": kl_div, "normalized_effect": normalized_effect}[name]


def sequence_scores(kind, columns, per_token):
    """A whole-answer metric (``"score": "sequence"``): per answer column, per scored row, the logits at
    the positions that predict the answer's tokens and those tokens; each row's answer log-probability
    summed (or averaged, ``per_token="mean"``), then what the kind reports. ``match``: every forced
    token the model's own choice (the mean: the share that is)."""
    combined = []
    for segments, answers in columns:
        row_values = []
        for logits, ids in zip(segments, answers):
            ids = ids.to(device=logits.device, dtype=torch.long)
            logits = logits.to(torch.float32)
            if kind == "match":
                hits = (logits.argmax(dim=-1) == ids).float()
                row_values.append(hits.min() if per_token == "sum" else hits.mean())
            else:
                picked = logits.log_softmax(dim=-1).gather(-1, ids[:, None]).squeeze(-1)
                row_values.append(picked.sum() if per_token == "sum" else picked.mean())
        combined.append(torch.stack(row_values) if row_values else torch.zeros(0))
    if kind == "cross_entropy":
        return -combined[0]
    if kind == "token_prob":
        return combined[0].exp()
    if kind == "logit_diff":
        return combined[0] - combined[1]
    return combined[0]


def score_sequence(ins, store):
    """A whole-answer metric scored where its forced reads are (``sequence_scores``)."""
    columns = []
    for segments, answers in ins["columns"]:
        columns.append(([evaluate(e, store) for e in segments], answers))
    store[ins["key"]] = unautocast(sequence_scores, (ins["kind"], columns, ins["per_token"]))


def score(ins, store):
    """A metric scored where its reads are: the rows it scores (an expression, ``evaluate``), its id
    columns, the reads it compares with, its parameters — in float32, autocast off, as the client's
    scorer (``ops/metrics.scored``) calls a kind. Stores the values, and which rows are defined."""
    logits = evaluate(ins["of"], store)
    reads = {}
    for slot, expr in ins["reads"]:
        reads[slot] = evaluate(expr, store).to(device=logits.device, dtype=torch.float32)
    ids = [t.to(device=logits.device, dtype=torch.long) for t in ins["ids"]]
    got = unautocast(call_metric, (metric_kind(ins["kind"]), logits.to(torch.float32), ids, reads, ins["params"]))
    values, defined = got if isinstance(got, tuple) else (got, None)
    store[ins["key"]] = values
    if defined is not None:
        store[ins["key"] + "/defined"] = defined


def call_metric(compute, logits, ids, reads, params):
    return compute(logits, *ids, **reads, **dict(params))


# --- the program: what the client compiled its walk's forwards into ---------------------------------------


def feature_write(x, feat, w, operand, f0):
    """One write of the program at its gathered ``x``: the seam in float32, back in x's dtype."""
    features = w["features"]
    x32 = x.to(torch.float32)
    f0_32 = None if f0 is None else f0.to(device=x.device, dtype=torch.float32)
    out = unautocast(write, (x32, featurize_bound(feat), inverse_bound(feat), mechanism(w["mechanism"]),
                             operand_bound(operand, features), w["params"], f0_32, features,
                             select_features, merge_features))
    return out.to(x.dtype)


# The seam takes functions of one featurizer's; the kernel has no closures, so a featurizer held
# as data is bound into a tuple the seam's callers unpack (``call``).

def featurize_bound(feat):
    return ("featurize", feat)


def inverse_bound(feat):
    return ("inverse", feat)


def operand_bound(operand, features):
    return ("operand", operand, features)


def call(bound, args):
    """A bound kernel function (see ``featurize_bound``), or a plain callable, applied to ``args``."""
    if not isinstance(bound, tuple):
        return bound(*args)
    if bound[0] == "featurize":
        return featurize(bound[1], *args)
    if bound[0] == "inverse":
        return inverse(bound[1], *args)
    return operand_tensor(bound[1], args[0], bound[2])


def project(model, spec, x):
    """A logit-lens read: the final norm's and the head's envoys called on ``x``, then the family's
    output transform (a multiplier, a divisor, a softcap)."""
    y = envoy(model, spec["head"])(envoy(model, spec["norm"])(x))
    return output_transform(y, spec["multiply"], spec["divide"], spec["softcap"])


def output_transform(y, multiply, divide, softcap):
    """The family's output transform, in the order its forward applies it: Cohere's scale, Granite's
    divisor, Gemma-2/3's final softcap (``tanh(y / c) * c``)."""
    if multiply is not None:
        y = y * multiply
    if divide is not None:
        y = y / divide
    if softcap:
        y = torch.tanh(y / softcap) * softcap
    return y


def envoy(model, dotted):
    found = model
    for part in dotted.split(".") if dotted else ():
        found = getattr(found, part)
    return found


def operand_of(spec, store):
    """A write's operand: a number, or a value the store holds (a read of this request, sliced to
    the write's rows where points ran at once)."""
    if spec is None:
        return None
    if "number" in spec:
        return float(spec["number"])
    value = store[spec["key"]]
    if spec.get("rows") is not None:
        value = value[spec["rows"][0]:spec["rows"][1]]
    return value


def window_of(op, act, step):
    """An op's window into ``act``: the one the client resolved, or at a decode step the step's own."""
    if step is None or op["step"] is None:
        return op["window"], op["ragged"]
    return last_window(act), False


def run_tap(model, act, tap, store, feats, step):
    """One tap's writes in order, then its reads, on ``act`` (``engine/taps.run_tap``'s order)."""
    columns = tap["columns"]
    before = act  # f0: the value before this pass's first write
    for w in tap["writes"]:
        if not fires(w["step"], step):
            continue
        mine = rows_of(act, w["rows"])
        window, ragged = window_of(w, mine, step)
        x = gather(mine, window, ragged, columns)
        f0 = gather(rows_of(before, w["rows"]), window, ragged, columns) if w["needs_f0"] else None
        feat = feats[w["featurizer"]] if w["featurizer"] else {"kind": "identity"}
        new = feature_write(x, feat, w, conform(operand_of(w["operand"], store), x), f0)
        written = scatter(mine, window, new, ragged, columns)
        act = written if w["rows"] is None else put_rows(act, w["rows"], written)
    for r in tap["reads"]:
        if not fires(r["step"], step):
            continue
        mine = rows_of(act, r["rows"])
        window, ragged = window_of(r, mine, step)
        x = gather(mine, window, ragged, columns)
        if r["view"] == "logits":
            x = project(model, r["project"], x)
        elif r["featurizer"]:
            x = unautocast(featurize, (feats[r["featurizer"]], x.float()))[0]
        if r["step"] == "stack":
            store.setdefault(r["key"], []).append(x)
        else:
            store[r["key"]] = x
    return act


def apply_groups(model, fw, store, feats, step):
    """Inside a trace (or one decode step of it): each group's value fetched once, in forward order,
    its taps run on it, and the value put back if any of them wrote (``engine/nnterp._apply_taps``)."""
    for group in fw["groups"]:
        if step is not None and not any(fires(op["step"], step) for tap in group["taps"]
                                        for op in (*tap["writes"], *tap["reads"])):
            continue
        target = envoy(model, group["path"])
        for name in group["chain"]:  # an operation inside the module's forward (.source.<op>…)
            target = getattr(target, name)
        value = getattr(target, group["attr"])
        written = False
        for tap in group["taps"]:
            x = get_value(group["kind"], value)
            act = x.reshape(fw["rows"], -1, x.shape[-1]) if group["flat"] else x
            new = run_tap(model, act, tap, store, feats, step)
            if group["flat"]:
                new = x if new is act else new.reshape(x.shape)
            if any(fires(w["step"], step) for w in tap["writes"]):
                value, written = put_value(group["kind"], value, new), True
        if written:
            setattr(target, group["attr"], value)


def forward(model, fw, store, feats):
    """One forward of the program: a ``model.trace``, or a ``model.generate`` stepping its taps."""
    device = model._module.get_input_embeddings().weight.device
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in fw["inputs"].items()}
    grad = torch.is_grad_enabled()  # the trace body runs on nnsight's worker thread
    if not fw["decode"]:
        with model.trace(inputs):
            with torch.set_grad_enabled(grad):
                apply_groups(model, fw, store, feats, None)
        return
    prompt = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    produced = {}  # filled in the block: a name first bound there does not come back out
    with model.generate(prompt, **fw["generation"]) as tracer:
        with torch.set_grad_enabled(grad):
            for i in tracer.iter[0:fw["decode"]]:
                apply_groups(model, fw, store, feats, i)
            produced["ids"] = tracer.result
    for key in fw["stacked"]:
        store[key] = torch.cat(store.pop(key), dim=1)
    store[fw["generated"]] = produced["ids"][:, fw["tokens"]:].detach().cpu()


def evaluate(expr, store):
    """A value the program derives on the server from what its forwards read: a key; rows of one
    (``slice``); several concatenated along rows (``cat``); a tensor method of ``DERIVING`` called
    on one (``call``: a published mean is ``vectors_mean``'s reshape, cast and mean)."""
    name = expr[0]
    if name == "key":
        return store[expr[1]]
    if name == "slice":
        return evaluate(expr[1], store)[expr[2]:expr[3]]
    if name == "cat":
        return torch.cat([evaluate(e, store) for e in expr[1]], dim=0)
    if name == "index":  # a basic index: integers and (start, stop, step) slices
        return evaluate(expr[1], store)[tuple(slice(*i) if isinstance(i, tuple) else i for i in expr[2])]
    if name == "split":  # piece expr[3] of the value split along rows into expr[2]'s sizes
        return torch.split(evaluate(expr[1], store), list(expr[2]))[expr[3]]
    if name == "index_select":
        value = evaluate(expr[1], store)
        return value.index_select(expr[2], torch.tensor(expr[3], dtype=torch.long, device=value.device))
    if name == "call" and expr[1] in DERIVING:
        return getattr(evaluate(expr[2], store), expr[1])(*expr[3], **dict(expr[4]))
    raise ValueError("kernel: unknown expression " + repr(name))


# The tensor methods a derivation may call (a reshape, a cast, a mean: what a published mean is).
DERIVING = ("reshape", "to", "mean", "float")


def vectors_mean(value):
    """The mean of every vector in ``value`` (any leading shape), in float32: ``(d,)``."""
    return value.reshape(-1, value.shape[-1]).to(torch.float32).mean(dim=0)


def run(model, program):
    """The whole request's model work, in order; what the client asked for comes home, on the CPU."""
    store = {}
    feats = program["featurizers"]
    with torch.no_grad():
        for ins in program["steps"]:
            if ins["op"] == "forward":
                forward(model, ins, store, feats)
            elif ins["op"] == "derive":
                store[ins["key"]] = evaluate(ins["expr"], store)
            elif ins["op"] == "score":
                score(ins, store)
            elif ins["op"] == "score_sequence":
                score_sequence(ins, store)
            else:
                raise ValueError("kernel: unknown instruction " + repr(ins["op"]))
    home = {}
    for key in program["home"]:
        value = store[key]
        home[key] = value.detach().cpu() if isinstance(value, torch.Tensor) else value
    return home


def served_dtype(model, head):
    """The dtype the server holds the unembedding in: what ran."""
    return str(envoy(model, head).weight.dtype)
