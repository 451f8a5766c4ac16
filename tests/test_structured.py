"""Grammars, tool calls and their request checks, without a model: the masks each verified row gets,
the answers read back into ``tool_calls``, and every bad ``response_format``/``tools``/``tool_choice``
answered 400 naming its field before any model work (on the tiny server)."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

pytest.importorskip("llguidance")

from anyspec.engine.grammar import Grammars  # noqa: E402
from anyspec.engine.loop import Stats  # noqa: E402
from anyspec.engine.proposers import Proposal, after_forced  # noqa: E402
from anyspec.engine.stats import count  # noqa: E402
from anyspec.server.answers import full_response, stream_chunks  # noqa: E402
from anyspec.server.scheduler import Outcome  # noqa: E402
from anyspec.server.structured import CallStream, read_tool_calls  # noqa: E402

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def grammars(tok_qwen2):
    return Grammars(tok_qwen2, len(tok_qwen2), {tok_qwen2.eos_token_id})


def allowed(masks: torch.Tensor, row: int, token: int) -> bool:
    return bool((int(masks[row, token >> 5]) >> (token & 31)) & 1)


def test_a_chain_is_cut_at_the_first_token_the_grammar_rejects(grammars, tok_qwen2):
    good = tok_qwen2.encode('{"name": "Bo",', add_special_tokens=False)
    bad = tok_qwen2.encode(" oops", add_special_tokens=False)
    constraint = grammars.json(PERSON, "schema").start(Stats())
    proposal, masks = constraint.rows(Proposal(good + bad + good))
    assert proposal.ids == good and masks.shape[0] == len(good) + 1
    for row, token in enumerate(good):
        assert allowed(masks, row, token)
    assert not allowed(masks, len(good), bad[0])
    constraint.advance(good)  # the rows were computed without moving the state
    assert constraint.rows(Proposal(good))[0].ids == []


def test_json_is_written_as_json_dumps_writes_it(grammars, tok_qwen2):
    constraint = grammars.json(PERSON, "schema").start(Stats())
    spaced = tok_qwen2.encode(json.dumps({"name": "Bo", "age": 3}), add_special_tokens=False)
    assert constraint.rows(Proposal(spaced))[0].ids == spaced
    for other in ('{"name":"Bo","age":3}', '{"name":  "Bo", "age": 3}', '{\n  "name": "Bo", "age": 3}'):
        ids = tok_qwen2.encode(other, add_special_tokens=False)
        assert len(constraint.rows(Proposal(ids))[0].ids) < len(ids) - 4  # cut at its first difference


def test_each_tree_row_follows_its_own_path(grammars, tok_qwen2):
    brace, name, age = (tok_qwen2.encode(t, add_special_tokens=False)[0] for t in ('{"', "name", "age"))
    tokens, parents = [brace, name, age], [-1, 0, 0]  # two branches after '{"'
    constraint = grammars.json(PERSON, "schema").start(Stats())
    _, masks = constraint.rows(Proposal([brace, name], trie=(tokens, parents)))
    assert allowed(masks, 0, brace) and allowed(masks, 1, name)
    assert not allowed(masks, 1, age)  # "name" is required first, in the schema's order
    assert not allowed(masks, 2, brace)


def test_a_grammar_is_compiled_once_and_its_forced_tokens_are_proposed(grammars, tok_qwen2):
    schema = {"type": "object", "properties": {"k": {"const": "fixed"}}, "required": ["k"],
              "additionalProperties": False}
    first = grammars.json(schema, "schema")
    assert grammars.json(schema, "schema") is first
    constraint = first.start(Stats())
    forced = constraint.forced(16)
    assert tok_qwen2.decode(forced).startswith('{"k": "fixed"')
    assert constraint.forced(0) == []


FIXED = {"type": "object", "properties": {"k": {"const": "fixed"}, "n": {"type": "integer"}},
         "required": ["k", "n"], "additionalProperties": False}


def test_the_tokens_the_grammar_forces_follow_a_chain(grammars, tok_qwen2):
    chain = tok_qwen2.encode('{"', add_special_tokens=False)
    constraint = grammars.json(FIXED, "schema").start(Stats())
    proposal, masks = constraint.rows(Proposal(chain), 16)
    tail = proposal.ids[len(chain):]
    assert proposal.ids[:len(chain)] == chain and proposal.tail == len(tail) >= 2
    assert tok_qwen2.decode(proposal.ids).startswith('{"k": "fixed", "n')
    assert masks.shape[0] == len(proposal.ids) + 1
    for row, token in enumerate(proposal.ids):
        assert allowed(masks, row, token)
    assert constraint.rows(Proposal(chain), 2)[0].ids == chain + tail[:2]
    assert constraint.rows(Proposal(chain), 0)[0].ids == chain  # a verify of the target alone
    bad = tok_qwen2.encode(" oops", add_special_tokens=False)
    assert constraint.rows(Proposal(chain + bad), 16)[0].ids == chain + tail  # cut, then followed


def test_forced_tokens_after_a_trie_chain_hang_from_its_last_node(grammars, tok_qwen2):
    chain = tok_qwen2.encode('{"', add_special_tokens=False)
    other = tok_qwen2.encode("[", add_special_tokens=False)
    constraint = grammars.json(FIXED, "schema").start(Stats())
    tokens, parents = chain + other, list(range(-1, len(chain) - 1)) + [-1]
    proposal, masks = constraint.rows(Proposal(chain, trie=(tokens, parents)), 3)
    tail = proposal.ids[len(chain):]
    assert len(tail) == 3 and proposal.trie[0] == tokens + tail
    n = len(tokens)
    assert proposal.trie[1] == parents + [len(chain) - 1, n, n + 1]
    assert masks.shape[0] == n + 4 and allowed(masks, n + 1, tail[1])


def test_the_grammars_tokens_around_the_drafts_are_not_counted_as_the_drafts():
    proposal = after_forced([1, 2], Proposal([3, 4], drafted=2, trie=([3, 4, 5], [-1, 0, -1])))
    assert proposal.ids == [1, 2, 3, 4] and proposal.lead == 2
    assert proposal.trie == ([1, 2, 3, 4, 5], [-1, 0, 1, 2, 1])
    proposal = proposal._replace(ids=[1, 2, 3, 4, 9], tail=1)
    spelled = [bytes([65 + i]) for i in range(16)]
    whole, cut = Stats(accepted_hist=[0] * 6), Stats(accepted_hist=[0] * 6)
    count(whole, proposal, [1, 2, 3, 4, 9], 7, spelled)
    count(cut, proposal, [1, 2, 3], 7, spelled)
    assert (whole.drafted, whole.accepted, whole.forced, whole.accepted_hist[2]) == (2, 2, 3, 1)
    assert (cut.drafted, cut.accepted, cut.forced, cut.rejected_at) == (2, 1, 2, [0, 1])
    assert proposal.drafted_part(5) == (2, 2) and proposal.drafted_part(1) == (0, 2)


@pytest.mark.parametrize(("schema", "says"), [
    ({"type": "nope"}, "not a valid JSON Schema"),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "unsupported JSON Schema feature"),
    ({"$ref": "#/definitions/missing"}, "not a valid JSON Schema"),
    ([1, 2], "must be a JSON Schema object"),
])
def test_bad_schemas_are_refused_naming_the_field(grammars, schema, says):
    from anyspec.engine.grammar_text import GrammarError

    with pytest.raises(GrammarError, match=says) as info:
        grammars.json(schema, "response_format.json_schema.schema")
    assert info.value.field == "response_format.json_schema.schema"


def test_a_schema_too_large_to_compile_in_bounded_time_is_refused(grammars, tok_qwen2):
    from anyspec.engine.grammar_text import GrammarError

    huge = {"enum": [f"value number {i} of a long list" for i in range(3000)]}
    with pytest.raises(GrammarError, match="at most 65536 are compiled"):
        grammars.json(huge, "s")
    many = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": "^[a-z]{3,40}[0-9]{2,9}$"}
                                             for i in range(50)}}
    grammars.json(many, "s")
    frugal = Grammars(tok_qwen2, len(tok_qwen2), {tok_qwen2.eos_token_id},
                      limits={"initial_lexer_fuel": 2000})
    with pytest.raises(GrammarError, match="too large or too complex to compile in bounded time"):
        frugal.json(many, "s")


def test_an_answers_statistics_count_prompt_lookups_tokens_beside_the_drafts():
    stats = Stats(algorithm="slem", rounds=5, drafted=6, accepted=3, generated=20, ngram_proposed=12,
                  ngram_accepted=10)
    out = full_response({}, False, [Outcome("x", "length", 20, 30, stats, True)])["anyspec"]
    assert (out["drafted"], out["accepted"], out["ngram_proposed"], out["ngram_accepted"]) == (6, 3, 12, 10)


def test_tool_call_blocks_are_read_into_openai_calls():
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    content, calls = read_tool_calls(text)
    assert content == "Let me look.\n"  # as written: streamed, it went out before the call
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    broken = "<tool_call>\nnot json\n</tool_call>"
    assert read_tool_calls(broken) == (broken, [])


@pytest.mark.parametrize(("ended", "finish"), [("stop", "tool_calls"), ("length", "length")])
def test_an_answer_cut_by_max_tokens_says_length_beside_the_calls_it_finished(ended, finish):
    import asyncio

    done = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    text = done + ("\n<tool_call>\n{\"name\": \"f" if ended == "length" else "")
    outcome = Outcome(text, ended, 30, 10, None, True)
    whole = full_response({}, True, [outcome], read_calls=True)["choices"][0]
    assert whole["finish_reason"] == finish and len(whole["message"]["tool_calls"]) == 1
    assert whole["message"]["content"] is None  # the call left open is not text
    events = iter([("text", text), ("done", outcome)])

    async def next_event():
        return next(events)

    async def chunks():
        return [c async for c in stream_chunks([next_event], {}, True, 1, False, read_calls=True)]

    last = json.loads(asyncio.run(chunks())[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == finish


def test_streamed_text_holds_back_only_what_may_begin_a_call():
    stream = CallStream()
    pieces = ("Sure, <to", 'ol_call>\n{"name": "f", ', '"arguments": {}}\n</tool_call>')
    out = [stream.feed(p) for p in pieces]
    assert out == ["Sure, ", "", ""]
    content, calls = stream.finish()
    assert content is None and calls[0]["function"]["name"] == "f"
    plain = CallStream()
    assert plain.feed("a <") == "a " and plain.feed("b>") == "<b>" and plain.finish() == (None, [])


@pytest.mark.parametrize("text", [
    '\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n',
    'Sure.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\nDone. ',
    '\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "g", '
    '"arguments": {}}\n</tool_call>',
    "  Just text, no call.\n", "\n", 'First <tool_call>\nnot json\n</tool_call> after'])
def test_streamed_text_and_calls_are_the_whole_answers(text):
    """Piece by piece, one character at a time, a stream gives the text and calls that the whole
    answer reads: whitespace alone before a call is no text, text keeps its own whitespace."""
    whole = read_tool_calls(text)
    stream = CallStream()
    said = "".join(stream.feed(c) for c in text)
    rest, calls = stream.finish()
    content = said + (rest or "")
    assert (content if content.strip() else None) == whole[0]
    assert [c["function"] for c in calls] == [c["function"] for c in whole[1]]


@pytest.mark.parametrize("vocab", [96, 100, 130])  # a whole number of words, part of one, past the mask
def test_masked_logits_are_llguidances_own_masking(vocab):
    """``grammar.masked`` against llguidance's ``apply_token_bitmask_inplace`` on random bitmasks: the
    same tokens at -inf and the rest unchanged, bit for bit."""
    import llguidance.torch as lltorch

    from anyspec.engine.grammar import masked

    g = torch.Generator().manual_seed(vocab)
    masks = torch.randint(-2**31, 2**31 - 1, (3, 4), generator=g, dtype=torch.int64).to(torch.int32)
    logits = torch.randn(3, vocab, generator=g)
    want = logits.clone()
    lltorch.apply_token_bitmask_inplace(want, masks)
    got = masked(logits, masks)
    assert torch.equal(got, want) and not torch.equal(got, logits)
    assert torch.equal(masked(logits[:2], masks), want[:2])


def test_a_verify_after_a_rolled_back_one_gets_the_target_alones_masks(grammars, tok_qwen2):
    """A verify reads its proposed tokens on copies of the state: on the state itself, consumed and
    rolled back, llguidance gave the next verify's rows a mask that allowed '",' after the key
    "playful" (its parser then refused the token the target chose: a 500 on a sampled JSON-mode
    request with the draft, where the target alone's answer was fine)."""
    def ids(text: str) -> list[int]:
        return tok_qwen2.encode(text, add_special_tokens=False)

    prefix = ('{"name": "Whiskers", "age": 2, "color": "black", "petType": "cat", "traits": {"furry": '
              'true, "gentle": true, "sensitive": true}, "sound": "meow", "hab')
    chain = ids('ful": true, "')
    used = grammars.json(None, "response_format").start(Stats())
    used.advance(ids(prefix))
    used.rows(Proposal(ids('its": ["sl')))  # a chain the target rejected
    used.advance(ids('its": {"play'))
    _, masks = used.rows(Proposal(chain))
    alone = grammars.json(None, "response_format").start(Stats())
    alone.advance(ids(prefix + 'its": {"play'))
    _, want = alone.rows(Proposal(chain))
    assert torch.equal(masks, want)
    assert not allowed(masks, 0, tok_qwen2.convert_tokens_to_ids('",'))


TWO_LETTERS = {"name": "get_time", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 2}}, "required": ["city"],
    "additionalProperties": False}}


@pytest.fixture(scope="module")
def target_tok():
    """The built-in target's tokenizer, where ``<tool_call>`` is one token."""
    from anyspec.models import DEFAULT_TARGET, gguf_path
    from anyspec.vocab import load_tokenizer

    return load_tokenizer(gguf_path(DEFAULT_TARGET))


def calls_taken(grammar, tok, ids: list[int]) -> list[int]:
    """What of ``ids``, then the end of the answer, the grammar lets through."""
    return grammar.start(Stats()).rows(Proposal(ids + [tok.eos_token_id]))[0].ids


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_call_opened_as_text_pieces_is_held_to_its_parameters(target_tok, choice):
    """Qwen2.5-Coder often writes ``<tool_call>`` as the text pieces ``<``, ``tool``, ``_call``, ``>``
    rather than as its token: a call opened so is a call all the same, held to the function's
    parameters, as one opened with the token is; text without a call stays free."""
    from anyspec.server.structured import structure

    tok = target_tok
    grammars = Grammars(tok, len(tok), {tok.eos_token_id})

    def enc(*parts: str) -> list[int]:
        return [i for part in parts for i in tok.encode(part, add_special_tokens=False)]

    opener, closer = (tok.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>"))
    pieces, closing = enc("<", "tool", "_call", ">"), enc("</", "tool", "_call", ">")
    assert len(pieces) == 4 and opener not in pieces
    tools = [{"type": "function", "function": TWO_LETTERS}]
    grammar = structure({"tools": tools, "tool_choice": choice}, True, tok, lambda: grammars).grammar
    lead = enc("Sure.\n") if choice == "auto" else []
    good, bad = ("\n" + json.dumps({"name": "get_time", "arguments": {"city": city}}) + "\n"
                 for city in ("PA", "Paris"))
    for opening, ending in ((pieces, closing), (pieces, [closer]), ([opener], closing), ([opener], [closer])):
        whole = lead + opening + enc(good) + ending + enc("\n")
        assert calls_taken(grammar, tok, whole) == whole + [tok.eos_token_id]
        wrong = lead + opening + enc(bad) + ending
        assert tok.decode(calls_taken(grammar, tok, wrong)).endswith('"city": "')  # "Paris": one token
    plain = enc("Paris is at UTC+1, <tool> tags aside.")
    expected = plain + [tok.eos_token_id] if choice == "auto" else []
    assert calls_taken(grammar, tok, plain) == expected


def nested(depth: int, wrap) -> object:
    """A value ``depth`` times wrapped by ``wrap``, around a string schema."""
    value = {"type": "string"}
    for _ in range(depth):
        value = wrap(value)
    return value


DEEP_SCHEMAS = [nested(64, lambda s: {"type": "object", "properties": {"a": s}, "required": ["a"]}),
                nested(200, lambda s: {"type": "array", "items": s}),
                nested(200, lambda s: {"anyOf": [s, {"type": "null"}]}),
                {"type": "array", "default": nested(500, lambda v: [v])},
                {"const": nested(500, lambda v: [v])}]


@pytest.mark.parametrize("schema", DEEP_SCHEMAS, ids=["properties", "items", "anyOf", "default", "const"])
def test_a_schema_nested_too_deep_is_refused_naming_the_field(grammars, schema):
    from anyspec.engine.grammar_text import GrammarError

    with pytest.raises(GrammarError, match="nests objects and arrays .* deep; at most") as info:
        grammars.json(schema, "response_format.json_schema.schema")
    assert info.value.field == "response_format.json_schema.schema"


def test_a_schema_as_deep_as_llguidance_reads_compiles(grammars):
    from anyspec.config import json_depth
    from anyspec.engine.grammar_text import JSON_DEPTH, GrammarError

    deepest = {"const": nested(JSON_DEPTH - 2, lambda v: [v])}
    assert json_depth(deepest) == JSON_DEPTH
    grammars.json(deepest, "s")
    with pytest.raises(GrammarError, match=f"{JSON_DEPTH + 1} deep"):
        grammars.json({"const": [deepest["const"]]}, "s")


@pytest.mark.parametrize(("kind", "value"), [("regex", "(a{1000}){1000}"),
                                             ("grammar", 'root ::= "a"{1000000}'),
                                             ("regex", "[bc]+(a{1000}){1000}")])
def test_a_grammar_too_complex_for_the_lexer_is_refused_as_it_compiles(grammars, kind, value):
    """Its first tokens already run out of the lexer's or the parser's fuel: refused before any
    answer starts, in one line without llguidance's dump of its state and grammar."""
    from anyspec.engine.grammar_text import GrammarError

    with pytest.raises(GrammarError, match="too large or too complex to compile in bounded time") as info:
        grammars.guide(kind, value, f"guided_{kind}")
    assert info.value.field == f"guided_{kind}"
    assert "\n" not in str(info.value) and "<state>" not in str(info.value)


def test_a_grammars_error_mid_answer_is_one_line_naming_the_field(grammars, tok_qwen2):
    from anyspec.errors import ConfigError

    rejected = tok_qwen2.encode("maybe")[0]
    constraint = grammars.guide("choice", ["yes", "no"], "guided_choice").start(Stats())
    constraint.matcher.consume_token(rejected)
    with pytest.raises(ConfigError) as info:
        constraint.rows(Proposal([]))
    assert info.value.field == "guided_choice"
    assert "\n" not in str(info.value) and "<state>" not in str(info.value)
    with pytest.raises(RuntimeError, match="a committed token broke the grammar") as broke:
        grammars.guide("choice", ["yes", "no"], "guided_choice").start(Stats()).advance([rejected])
    assert "\n" not in str(broke.value) and "<state>" not in str(broke.value)


def deepest_grammar(limit: int) -> str:
    """The Lark grammar of at most ``limit`` bytes whose rules chain deepest for llguidance's
    compiler, which recurses per rule and per parenthesis: each rule is the next one's name in 28
    parentheses (the most it nests), the names as short as they come."""
    letters, rest = "abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnopqrstuvwxyz0123456789_"
    names = (head + "".join(tail) for length in (1, 2, 3) for head in letters
             for tail in itertools.product(rest, repeat=length - 1))
    names = (name for name in names if name != "start")
    name = next(names)
    rules = [f"start: {name}\n"]
    size = len(rules[0])
    for following in names:
        rule = f"{name}: {'(' * 28}{following}{')' * 28}\n"
        if size + len(rule) + len(f'{following}: "a"\n') > limit:
            break
        rules.append(rule)
        size += len(rule)
        name = following
    return "".join(rules) + f'{name}: "a"\n'


COMPILE_DEEP = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from tokenizer_files import _load, ggml_vocab_file
from anyspec.engine import grammar, grammar_text
from anyspec.engine.loop import Stats
from anyspec.engine.proposers import Proposal

grammar_text.NATIVE_STACK //= 3  # the deepest grammar the cap allows fits in a third of the stack
tok = _load(ggml_vocab_file("qwen2"))
grammars = grammar.Grammars(tok, len(tok), {tok.eos_token_id})
for path in sys.argv[2:]:
    text = open(path).read()
    lark = grammar_text.guide_grammar("grammar", text, "g")
    grammar_text.check_grammar(lark, "g", grammar_text.GUIDES["grammar"])
    compiled = grammars.guide("grammar", text, "g")

    def answer():  # a generation's steps and masks, on an ordinary thread's stack
        constraint = compiled.start(Stats())
        forced = constraint.forced(4)
        constraint.rows(Proposal(forced))
        constraint.advance(forced)
        print(path, tok.decode(forced), flush=True)

    threading.stack_size(1 << 20)
    thread = threading.Thread(target=answer)
    thread.start()
    thread.join()
"""


def test_grammars_chained_as_deep_as_the_cap_allows_compile_and_generate(tmp_path):
    """llguidance compiles a chain of rules recursively, in native frames; on an ordinary thread's
    8 MiB stack 3,000 plain rules overflow it and the process dies. Compiled on a stack of its own,
    the deepest chain MAX_SCHEMA_BYTES allows fits in a third of it; its steps need no deep stack."""
    import subprocess
    import sys
    from pathlib import Path

    from anyspec.engine.grammar_text import MAX_SCHEMA_BYTES

    deepest = deepest_grammar(MAX_SCHEMA_BYTES)
    assert MAX_SCHEMA_BYTES - 100 < len(deepest) <= MAX_SCHEMA_BYTES
    chain = "".join(f"r{i}: r{i + 1}\n" for i in range(4000))
    grammars = {"lark": "start: r0\n" + chain + 'r4000: "a"\n',
                "gbnf": "root ::= r0\n" + chain.replace(":", " ::=") + 'r4000 ::= "a"\n',

                "deepest": deepest}
    paths = []
    for name, text in grammars.items():
        (path := tmp_path / f"{name}.txt").write_text(text)
        paths.append(str(path))
    tests = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", COMPILE_DEEP, tests, *paths], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [p for path in paths for p in (path, "a")]


def test_a_grammar_asked_for_under_another_field_is_not_compiled_again(grammars):
    first = grammars.guide("regex", "ab+", "guided_regex")
    again = grammars.guide("regex", "ab+", "structured_outputs.regex")
    assert again.matcher is first.matcher and (first.field, again.field) == ("guided_regex",
                                                                              "structured_outputs.regex")
    assert grammars.guide("regex", "ab+", "guided_regex") is first
