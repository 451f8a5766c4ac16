"""The target's side of a generation: its prompt read into the cache (``prefill``), and a round's
proposal checked in one forward (``verify``: a chain, or a trie of branches), each row's choice the
target's own at its position, so that the accepted tokens are those it would have written alone."""

from __future__ import annotations

from anyspec.algorithms import tli, tree
from anyspec.algorithms.sampling import TokenLogprob, argmax, token_logprobs
from anyspec.config import SamplingParams
from anyspec.engine.batch import PREFILL_CHUNK, Forward, Meter, Steps, chunked
from anyspec.engine.grammar import masked
from anyspec.engine.prefix import reusable, reuse_prefix
from anyspec.engine.prompt import check_room, encode_prompt
from anyspec.engine.proposers import Proposal
from anyspec.engine.sampler import Sampler
from anyspec.engine.stats import Stats


def prefill(engine, target, draft, prompt: str | list[dict], params: SamplingParams, stats: Stats,
            meter: Meter, encoded: tuple[list[int], str] | None = None, stop=None) -> Steps:
    """The prompt into the target's cache but for its last token (returned: committed, not yet
    cached), the draft's context, the prompt's target ids and, with ``params.prompt_logprobs``, its
    tokens' logprobs; a prefix the sequence's previous request left may be kept (not when scoring
    the prompt: its rows are computed anew). ``stop`` set: the rest of the prompt is left out."""
    ids, text = encoded if encoded is not None else encode_prompt(engine.target.tokenizer, prompt)[:2]
    check_room(len(ids), params.max_new_tokens, engine.target.context_length)
    stats.prompt_tokens = len(ids)
    scored = params.prompt_logprobs is not None
    reuse = engine.config.prefix_cache and not scored
    spent = meter.mark()
    with meter.timing(target):
        stats.prompt_cached = reuse_prefix(target, ids[:-1], reuse)
    prompt_logprobs = (yield from scored_prefill(target, ids, params.prompt_logprobs)) if scored else None
    if not scored and len(ids) - 1 > stats.prompt_cached:
        yield from chunked(target, ids[stats.prompt_cached:-1], 1, stop=stop)
    stats.prefill_seconds = meter.seconds(target, since=spent)
    if draft is None:
        return ids[-1], None, ids, prompt_logprobs
    if not reusable(draft, engine.config.prefix_cache):
        draft.reset()  # else the first round's catch-up keeps what the draft's prompt shares
    return ids[-1], engine.reader.start(prompt, text, ids), ids, prompt_logprobs


def scored_prefill(target, ids: list[int], n: int) -> Steps:
    """``ids`` but the last through ``target``, every row's logits kept: each token's logprob
    after the ones before it, with the ``n`` likeliest (the first token: None)."""
    out: list[TokenLogprob | None] = [None]
    for start in range(0, len(ids) - 1, PREFILL_CHUNK):
        piece = ids[start:min(start + PREFILL_CHUNK, len(ids) - 1)]
        rows = yield Forward(target, piece)
        out += token_logprobs(rows, ids[start + 1:start + 1 + len(piece)], n)
    return out


def verify(target, pending: int, proposal: Proposal, sampler: Sampler | None, position: int,
           mask=None, penalize=None) -> Steps:
    """The proposed tokens the target accepts, the token it adds, and the logits rows that chose
    them (``[accepted + 1, V]``); its cache keeps those tokens. Each
    row's choice is the target's own at its generated position (the first at ``position``): its
    argmax, or with a ``sampler`` its Gumbel-max choice. A proposed token is accepted when it is
    that choice. ``mask``: each row's grammar mask (``grammar.Constraint.rows``), applied first;
    ``penalize``: the rows' penalties and logit bias (``Penalties.rows``), then."""
    if proposal.trie:
        return (yield from verify_tree(target, pending, proposal, sampler, position, mask, penalize))
    proposed = proposal.ids
    logits = masked((yield Forward(target, [pending] + proposed)), mask)
    logits = penalize(logits) if penalize else logits
    rows = range(position, position + len(proposed) + 1)
    n, token = tli.verify_exact(sampler.choices(logits, rows) if sampler else argmax(logits), proposed)
    target.crop(target.num_cached - (len(proposed) - n))
    return proposed[:n], token, logits[:n + 1]


def verify_tree(target, pending: int, proposal: Proposal, sampler: Sampler | None, position: int,
                mask=None, penalize=None) -> Steps:
    """``verify`` of a chain and its branches in one forward of their trie."""
    tokens, parents = proposal.trie
    rows = [-1] + [up + 1 for up in parents]  # the pending token's row, then the trie's
    logits = masked((yield Forward(target, [pending] + tokens, parents=rows)), mask)
    logits = penalize(logits) if penalize else logits
    rows = [position + depth for depth in tree.depths(rows)]
    path, token = tree.verify_exact(sampler.choices(logits, rows) if sampler else argmax(logits), tokens,
                                    parents)
    kept = [0] + [1 + j for j in path]
    target.keep_rows(target.num_cached - len(tokens) - 1, kept)
    return [tokens[j] for j in path], token, logits[kept]
