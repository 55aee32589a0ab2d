from hypothesis import given, settings
from hypothesis import strategies as st

from tether.agent.episode import LocalEnvBatch
from tether.agent.format import parse_reply


def test_well_formed_reply():
    p = parse_reply("<think>At (0,0), goal (3,3).</think> <answer>Down || Right</answer>")
    assert p.format_ok and p.reasoning == "At (0,0), goal (3,3)." and p.answer == "Down || Right"


def test_non_greedy_match_takes_first_block():
    p = parse_reply("<think>a</think><answer>Up</answer><answer>Down</answer>")
    assert p.format_ok and p.answer == "Up"


def test_empty_reasoning_is_allowed_but_empty_answer_is_not():
    assert parse_reply("<think></think><answer>Up</answer>").format_ok
    assert not parse_reply("<think>x</think><answer>  </answer>").format_ok


HOSTILE = [
    "",
    "Down",
    "no tags at all, just words",
    "<think>unterminated reasoning <answer>Up</answer>",
    "<think>ok</think><answer>unterminated",
    "<think><think>nested</think></think><answer>Up</answer>",
    "<think>a</think><answer><answer>Up</answer></answer>",
    "garbage before <think>a</think><answer>Up</answer>",
    "<think>" + "x" * 3_000_000 + "</think><answer>Up</answer>",
    "<think>" * 200_000,
    b"<think>\xff\xfe</think><answer>Up</answer>",
    "<think>bytes \ufffd decoded badly</think><answer>Up</answer>",
]


def test_hostile_replies_are_format_errors():
    for reply in HOSTILE:
        parsed = parse_reply(reply)
        assert not parsed.format_ok, reply[:60]
        assert parsed.error


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(),
        st.binary(),
        st.lists(
            st.sampled_from(
                ["<think>", "</think>", "<answer>", "</answer>", "Up", " ", "||", "\n", "\x00", "é"]
            ),
            max_size=30,
        ).map("".join),
    )
)
def test_parser_never_raises(reply):
    parsed = parse_reply(reply)
    assert isinstance(parsed.format_ok, bool)
    if parsed.format_ok:
        assert parsed.answer and "<answer>" not in parsed.answer


def test_format_error_costs_penalty_and_no_env_step():
    pool = LocalEnvBatch("tether/FrozenLake-v0", {"format_penalty": -0.1})
    [obs] = pool.reset([7])
    [outcome] = pool.step([(0, None)])
    assert outcome.reward == -0.1 and not outcome.action_valid and not outcome.done
    assert outcome.state == obs.state and outcome.actions_left == obs.actions_left
    [outcome] = pool.step([(0, "Jump || Fly")])
    assert outcome.reward == -0.1 and outcome.state == obs.state
