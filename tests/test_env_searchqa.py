"""SearchQA: SQuAD-style rewards, search/finish episodes, BM25 retrieval and its cache,
the generated knowledge base, HotpotQA-style loaders, stochastic actions, safety on
any input, demonstrations."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.envs import make
from tether.envs.searchqa import SearchQAEnv, answer_reward, parse_action, token_f1
from tether.envs.searchqa_data import generate_knowledge_base


@pytest.mark.parametrize(
    "prediction, gold, reward",
    [
        ("Zuput", "Zuput", 1.0),
        ("zuput.", "Zuput", 1.0),
        ("The  Nalaze Works", "Nalaze Works", 1.0),
        ("Nalaze", "Nalaze Works", 2 / 3),  # p=1, r=1/2
        ("Nalaze Labs Group", "Nalaze Works", 0.4),  # p=1/3, r=1/2
        ("an x y z Nalaze", "Nalaze Works", 1 / 3),  # p=1/4, r=1/2: just above 0.3
        ("v x y z Nalaze", "Nalaze Works", 0.0),  # p=1/5, r=1/2: F1 0.29 < 0.3
        ("Loro Labs", "Nalaze Works", 0.0),
        ("1999", "1941", 0.0),
    ],
)
def test_answer_reward(prediction, gold, reward):
    got, exact, f1 = answer_reward(prediction, gold)
    assert got == pytest.approx(reward) and exact == (reward == 1.0)
    assert f1 == pytest.approx(token_f1(prediction, gold) if not exact else 1.0)


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("search[Nalaze Works]", ("search", "Nalaze Works")),
        ("  Finish [ the  answer ] ", ("finish", "the answer")),
        ("SEARCH[a [nested query]", ("search", "a [nested query")),
        ("search[a] finish[b]", None),
        ("search[a]\nfinish[b]", None),
        ("search[a [b] c]", None),
        ("search Nalaze", None),
        ("finish[]", None),
        ("finish[  ]", None),
        ("search[!!!]", None),
        ("look[Zuput]", None),
        ("search[x] finish[y", None),
        ("", None),
        (None, None),
        (3, None),
        ("search[" + "a" * 201 + "]", None),
    ],
)
def test_parse_action(text, parsed):
    assert parse_action(text) == parsed


def fixed_two_hop() -> SearchQAEnv:
    """The generated world's two-hop question of seed 2, set explicitly."""
    env = SearchQAEnv()
    env.reset(
        options={
            "question": "In which city is the company of Tafep Zufen based?",
            "answer": "Mane",
            "hops": ["Tafep Zufen", "Loro Works"],
        }
    )
    return env


def test_a_two_hop_episode_by_hand():
    env = fixed_two_hop()
    assert env.render() == (
        "Question: In which city is the company of Tafep Zufen based?\nNo search yet."
    )
    assert env.actions_left() == 5 and env.solve() == [
        "search[Tafep Zufen]",
        "search[Loro Works]",
        "finish[Mane]",
    ]
    obs, reward, terminated, truncated, info = env.step("search[Tafep Zufen]")
    assert (reward, terminated, truncated) == (0.0, False, False) and info["action_is_valid"]
    assert obs.splitlines()[1:] == [
        "Results for Tafep Zufen:",
        "1. Tafep Zufen: Tafep Zufen is a painter born in Diba. Tafep Zufen works at Loro Works.",
    ]
    obs, _, _, _, _ = env.step("search[Loro Works]")
    assert (
        obs.splitlines()[2].startswith("1. Loro Works: Loro Works is a company based in Mane.")
        and len(obs.splitlines()) == 5
    )  # top 3
    obs, reward, terminated, truncated, info = env.step("finish[Mane]")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert obs.endswith("Final answer: Mane") and env.actions_left() == 2
    assert env.step("finish[Mane]")[1] == env.format_penalty  # over


@pytest.mark.parametrize(
    "answer, reward, success",
    [
        ("finish[Mane]", 1.0, True),
        ("finish[the mane.]", 1.0, True),
        ("finish[Mane city]", 2 / 3, False),
        ("finish[Diba]", 0.0, False),
    ],
)
def test_finish_rewards(answer, reward, success):
    _, got, terminated, _, info = fixed_two_hop().step(answer)
    assert got == pytest.approx(reward) and terminated and info["success"] == success


@pytest.mark.parametrize(
    "answer",
    [
        "Mane",
        "search Mane",
        "finish[]",
        "search[???]",
        "answer[Mane]",
        "",
        None,
        "search[x]\nfinish[y]",
    ],
)
def test_malformed_actions_cost_the_penalty_and_no_turn(answer):
    env = fixed_two_hop()
    before = env.render()
    obs, reward, terminated, truncated, info = env.step(answer)
    assert (reward, terminated, truncated, info["action_is_valid"]) == (-0.1, False, False, False)
    assert obs == before and env.actions_left() == 5


def test_running_out_of_turns_truncates_with_zero():
    env = SearchQAEnv(max_turns=3)
    env.reset(seed=0)
    outcomes = [env.step(f"search[query {k}]")[1:4] for k in range(3)]
    assert outcomes == [(0.0, False, False), (0.0, False, False), (0.0, False, True)]
    _, reward, _, _, info = env.step("finish[x]")
    assert reward == env.format_penalty and not info["action_is_valid"]


def test_knowledge_base_is_deterministic_and_answers_need_search():
    a = generate_knowledge_base.__wrapped__(0, 100)
    assert a == generate_knowledge_base.__wrapped__(0, 100)
    assert a != generate_knowledge_base.__wrapped__(1, 100)
    titles, texts = a.documents()
    assert len(titles) == len(set(titles)) == 100 + 20 + 12 + 2
    titles, texts = generate_knowledge_base(3, 100).documents()
    e1, e2 = (
        SearchQAEnv(kb_seed=3, num_people=100),
        make("tether/SearchQA-v0", kb_seed=3, num_people=100),
    )
    questions = set()
    for seed in range(60):
        assert e1.reset(seed=seed) == e2.reset(seed=seed)
        question = e1.question
        questions.add(question.text)
        assert question.answer.lower() not in question.text.lower()
        last_doc = texts[titles.index(question.hops[-1][0])]
        assert question.answer in last_doc  # ... but the last document on the chain has it
    assert len(questions) >= 45  # 2 countries and 12 cities repeat a little
    hops = {
        SearchQAEnv(two_hop_fraction=f).reset(seed=s)[1]["hops"]
        for f in (0.0, 1.0)
        for s in range(20)
    }
    assert hops == {1, 2}
    assert all(SearchQAEnv(two_hop_fraction=0.0).reset(seed=s)[1]["hops"] == 1 for s in range(20))


def test_bm25_finds_the_entity_and_the_index_is_shared(monkeypatch):
    from tether.envs import searchqa_data

    env = SearchQAEnv()
    first = env.corpus.search("Tafep Zufen", 3)
    assert env.corpus.titles[first[0]] == "Tafep Zufen" and len(first) == 1
    assert env.corpus.search("the of and", 3) == [] and env.corpus.search("qqqq", 3) == []
    # A second env and its resets index nothing again (counted, not timed).
    built = []

    class CountingCorpus(searchqa_data.Corpus):
        def __init__(self, *args, **kwargs):
            built.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(searchqa_data, "Corpus", CountingCorpus)
    other = make("searchqa")
    for seed in range(100):
        other.reset(seed=seed)
    assert other.corpus is env.corpus and built == []
    short = SearchQAEnv(top_k=1, passage_words=4)
    assert short.corpus is env.corpus
    short.reset(options={"question": "q", "answer": "a"})
    obs = short.step("search[Loro Works]")[0]
    assert obs.splitlines()[1:] == ["Results for Loro Works:", "1. Loro Works: Loro Works is a ..."]


HOTPOT = [
    {
        "_id": "5a8b57f25542995d1e6f1371",
        "answer": "yes",
        "type": "comparison",
        "level": "hard",
        "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
        "supporting_facts": [["Scott Derrickson", 0], ["Ed Wood", 0]],
        "context": [
            [
                "Ed Wood (film)",
                [
                    "Ed Wood is a 1994 American biographical film directed by Tim Burton.",
                    " It stars Johnny Depp.",
                ],
            ],
            [
                "Scott Derrickson",
                [
                    "Scott Derrickson (born July 16, 1966) is an American director.",
                    " He lives in Los Angeles.",
                ],
            ],
            ["Ed Wood", ["Edward Davis Wood Jr. was an American filmmaker and actor."]],
        ],
    },
    {
        "_id": "5a8c7595554299585d9e36b6",
        "answer": "Chief of Protocol",
        "type": "bridge",
        "level": "medium",
        "question": "What government position was held by the woman who portrayed Corliss Archer "
        "in the film Kiss and Tell?",
        "supporting_facts": [["Kiss and Tell (1945 film)", 0], ["Shirley Temple", 0]],
        "context": [
            [
                "Kiss and Tell (1945 film)",
                ["Kiss and Tell is a 1945 comedy film starring Shirley Temple as Corliss Archer."],
            ],
            [
                "Shirley Temple",
                [
                    "Shirley Temple Black was an American actress who served "
                    "as Chief of Protocol of the United States."
                ],
            ],
        ],
    },
]


def test_loader_reads_hotpotqa_json_with_contexts(tmp_path):
    path = tmp_path / "hotpot_dev_distractor_v1.json"
    path.write_text(json.dumps(HOTPOT))
    env = SearchQAEnv(data_path=str(path))
    assert sorted(env.corpus.titles) == [
        "Ed Wood",
        "Ed Wood (film)",
        "Kiss and Tell (1945 film)",
        "Scott Derrickson",
        "Shirley Temple",
    ]
    rng = np.random.default_rng(0)
    for seed in range(10):
        obs, info = env.reset(seed=seed)
        assert obs.startswith(f"Question: {HOTPOT[info['index']]['question']}")
        rewards = []
        for _ in range(5):
            reasoning, action = env.demonstration(rng)
            assert len(reasoning.split()) <= 25
            _, reward, terminated, truncated, _ = env.step(action)
            rewards.append(reward)
            if terminated or truncated:
                break
        assert rewards == [0.0, 0.0, 1.0]  # two supporting documents, then the answer
    env.reset(
        options={
            "question": "Who is [the] actress?",
            "answer": "Shirley [Temple]",
            "hops": ["Shirley Temple"],
        }
    )
    assert env.solve() == ["search[Shirley Temple]", "finish[Shirley (Temple)]"]
    assert env.step(env.solve()[-1])[1] == 1.0  # brackets are swapped, the answer still matches
    env.reset(options={"question": "Who played Corliss Archer?", "answer": "Shirley Temple"})
    obs = env.step("search[Corliss Archer film]")[0]
    assert obs.splitlines()[2].startswith("1. Kiss and Tell (1945 film): Kiss and Tell is a 1945")


def test_loader_reads_hf_jsonl_questions_with_a_corpus_file(tmp_path):
    questions = tmp_path / "hotpot.jsonl"
    with questions.open("w") as handle:
        for record in HOTPOT:
            facts = record["supporting_facts"]
            hf = dict(
                record,
                supporting_facts={"title": [t for t, _ in facts], "sent_id": [i for _, i in facts]},
                context={
                    "title": [t for t, _ in record["context"]],
                    "sentences": [s for _, s in record["context"]],
                },
            )
            handle.write(json.dumps(hf) + "\n")
        handle.write("not json\n")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "\n".join(
            json.dumps(d)
            for d in [
                {"title": "Shirley Temple", "text": "Shirley Temple was Chief of Protocol."},
                {
                    "title": "Kiss and Tell (1945 film)",
                    "text": ["Kiss and Tell stars", "Shirley Temple."],
                },
                {"contents": '"Ed Wood"\nEd Wood was an American filmmaker.'},
            ]
        )
    )
    env = SearchQAEnv(data_path=str(questions), corpus_path=str(corpus))
    assert env.corpus.titles == ["Shirley Temple", "Kiss and Tell (1945 film)", "Ed Wood"]
    assert env.corpus.texts[1] == "Kiss and Tell stars Shirley Temple."
    assert len(env.questions) == 2 and env.questions[1].hops[1] == ("Shirley Temple", "")
    env.reset(seed=0)
    plan = env.solve()
    assert plan[-1] == f"finish[{env.question.answer}]"
    with pytest.raises(FileNotFoundError, match="not found"):
        SearchQAEnv(data_path=str(tmp_path / "missing.json"))
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"question": "q?", "answer": "a"}) + "\n")
    with pytest.raises(ValueError, match="corpus_path"):
        SearchQAEnv(data_path=str(bare))


def play(env: SearchQAEnv, seed: int, actions: list[str]) -> list[tuple]:
    env.reset(seed=seed)
    out = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs, reward, terminated, truncated, tuple(info["executed_actions"])))
        if terminated or truncated:
            break
    return out


def test_stochasticity_zero_is_deterministic_and_one_ignores_the_action():
    sensible = ["search[Tafep Zufen]", "search[Loro Works]", "finish[Mane]"]
    other = ["finish[Mane]"] * 5
    for seed in range(5):
        assert play(SearchQAEnv(), seed, sensible) == play(SearchQAEnv(), seed, sensible)
        assert play(SearchQAEnv(), seed, other)[0][2] is True  # p=0: the finish runs
        noisy_a = play(SearchQAEnv(stochasticity=1.0), seed, sensible + ["finish[x]"] * 2)
        noisy_b = play(SearchQAEnv(stochasticity=1.0), seed, other)
        assert noisy_a == noisy_b and len(noisy_a) == 5 and noisy_a[-1][3] is True
        assert all(step[1] == 0.0 for step in noisy_a)
        titles = set(SearchQAEnv().corpus.titles)
        assert all(step[4][0][len("search[") : -1] in titles for step in noisy_a)
    replaced = [
        play(SearchQAEnv(stochasticity=0.3), s, other)[0][4][0] != "finish[Mane]"
        for s in range(200)
    ]
    assert 40 < sum(replaced) < 80


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=60)
    | st.builds(
        lambda k, t: f"{k}[{t}]",
        st.sampled_from(["search", "finish", "Search"]),
        st.text(max_size=40),
    )
)
def test_step_never_raises(action):
    env = SearchQAEnv(stochasticity=0.2)
    env.reset(seed=1)
    for _ in range(6):
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and obs.startswith("Question: ")
        assert 0.0 <= reward <= 1.0 if info["action_is_valid"] else reward == env.format_penalty


def test_demonstrations_succeed_and_noise_fails():
    env, rng = SearchQAEnv(), np.random.default_rng(0)
    for seed in range(100):
        env.reset(seed=seed)
        total, turns = 0.0, 0
        for turns in range(1, 6):  # noqa: B007 (the count is read after the loop)
            reasoning, action = env.demonstration(rng)
            assert len(reasoning.split()) <= 25
            _, reward, terminated, truncated, _ = env.step(action)
            total += reward
            if terminated or truncated:
                break
        assert total == 1.0 and turns == len(env.question.hops) + 1
    env.reset(seed=2)
    steps = []
    for _ in range(3):
        steps.append(env.demonstration(rng))
        env.step(steps[-1][1])
    assert steps == [
        ("I need facts about Tafep Zufen.", "search[Tafep Zufen]"),
        ("Tafep Zufen works at Loro Works. I need facts about Loro Works.", "search[Loro Works]"),
        ("Loro Works is based in Mane. The answer is Mane.", "finish[Mane]"),
    ]
    env.reset(seed=2)
    env.step("search[Tafep Zufen]")
    env.step("search[Loro Works]")
    wrong = [env.demonstration(rng, noise=1.0) for _ in range(20)]
    assert all(a != "finish[Mane]" and a.startswith("finish[") for _, a in wrong)
    assert all(r == f"I guess the answer is {a[7:-1]}." for r, a in wrong)


def test_gymnasium_make_with_the_env_checker_and_a_step_before_reset():
    import gymnasium as gym

    env = gym.make("tether/SearchQA-v0")  # the passive checker validates our returns
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    obs, reward, _, _, info = env.step("search[Kabun Group]")
    assert info["action_is_valid"] and env.observation_space.contains(obs)
    fresh = SearchQAEnv()
    obs, reward, _, _, info = fresh.step("search[x]")
    assert reward == fresh.format_penalty and obs == "No question: call reset()."
