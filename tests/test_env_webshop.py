"""WebShop: pages and actions, WebShop's reward on hand-written purchases, the
real-format loader, the generated catalogue, stochastic actions, the expert's
demonstrations, and no crash on any input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.envs import make
from tether.envs.webshop import (
    View,
    WebShopEnv,
    fuzzy_match,
    generated_shop,
    load_shop,
    parse_product,
    reward,
)

ITEMS = [
    {
        "asin": "B0BOOTS001",
        "name": "Waterproof Leather Hiking Boots for Men",
        "pricing": "$45.99",
        "customization_options": {
            "Color": [{"value": "Black", "image": None}, {"value": "Brown", "image": None}],
            "Size": [{"value": "9", "image": None}, {"value": "10", "image": None}],
        },
        "product_category": "Clothing, Shoes & Jewelry › Men › Shoes › Boots",
        "query": "men's boots",
        "category": "fashion",
        "small_description": ["Rubber sole", "Waterproof membrane"],
        "full_description": "Sturdy boots.",
    },
    {
        "asin": "B0SHOES002",
        "name": "Leather Dress Shoes for Men",
        "pricing": "$60.00 - $75.00",
        "customization_options": {"Color": [{"value": "Black"}]},
        "product_category": "Clothing, Shoes & Jewelry › Men › Shoes › Oxfords",
        "query": "men's shoes",
        "category": "fashion",
    },
    {
        "asin": "B0BOTTLE03",
        "name": "Stainless Steel Water Bottle",
        "pricing": "$15.00",
        "customization_options": None,
        "product_category": "Sports › Outdoors › Water Bottles",
        "query": "water bottle",
        "category": "sports",
    },
    {
        "asin": "B0WINTER04",
        "name": "Insulated Winter Boots",
        "pricing": "$120.00",
        "customization_options": {"Color": [{"value": "Black / Grey"}], "Size": [{"value": "10"}]},
        "product_category": "Clothing, Shoes & Jewelry › Women › Shoes › Boots",
        "query": "winter boots",
        "category": "fashion",
    },
]
GOAL = {
    "asin": "B0BOOTS001",
    "instruction_text": "i need waterproof leather boots, black, size 9, "
    "and price lower than 50.00 dollars",
    "attributes": ["waterproof", "leather"],
    "goal_options": {"color": "black", "size": "9"},
    "price_upper": 50.0,
}


@pytest.fixture()
def shop_files(tmp_path):
    products, goals = tmp_path / "items_shuffle.json", tmp_path / "goals.json"
    products.write_text(json.dumps(ITEMS))
    goals.write_text(json.dumps([GOAL, {"asin": "B0UNKNOWN", "instruction_text": "x"}]))
    return str(products), str(goals)


@pytest.fixture()
def boots(shop_files) -> WebShopEnv:
    env = WebShopEnv(*shop_files)
    env.reset(options={"goal": 0})
    return env


def play(env: WebShopEnv, actions: list[str]) -> tuple[float, dict]:
    reward_sum, info = 0.0, {}
    for action in actions:
        _, reward_value, terminated, truncated, info = env.step(action)
        assert info["action_is_valid"], (action, env.render())
        reward_sum += reward_value
    return reward_sum, info


@pytest.mark.parametrize(
    "actions, expected",
    [
        (["click[B0BOOTS001]", "click[black]", "click[9]", "click[buy now]"], 1.0),  # all 5 of 5
        (["click[B0BOOTS001]", "click[brown]", "click[9]", "click[buy now]"], 0.8),  # wrong colour
        (["click[B0BOOTS001]", "click[buy now]"], 0.6),  # no options
        (["click[B0WINTER04]", "click[Black | Grey]", "click[buy now]"], 0.2),  # colour only
        (["click[B0SHOES002]", "click[black]", "click[buy now]"], 0.4),  # leather + colour
    ],
)
def test_purchase_rewards_follow_webshop(boots, actions, expected):
    got, info = play(boots, ["search[boots leather waterproof]", *actions])
    assert got == pytest.approx(expected) and boots.done
    assert info["success"] == (expected == 1.0)


def test_wrong_product_type_scores_zero(boots):
    got, info = play(boots, ["search[water bottle]", "click[B0BOTTLE03]", "click[buy now]"])
    assert got == 0.0 and not info["success"]  # no type word in common with hiking boots


def test_reward_parts_by_hand(shop_files):
    shop = load_shop(*shop_files)
    goal, target = shop.goals[0], shop.product("B0BOOTS001")
    # the price bound alone, then attributes, then options
    cheap = parse_product({"asin": "X", "name": "Hiking Boots", "pricing": "$10"})
    assert reward(cheap, {}, goal, target) == pytest.approx(1 / 5)
    assert reward(target, {"color": "black"}, goal, target) == pytest.approx(4 / 5)
    over = parse_product({**ITEMS[0], "pricing": "$55"})
    assert reward(over, {"color": "black", "size": "9"}, goal, target) == pytest.approx(4 / 5)


@pytest.mark.parametrize(
    "answer",
    [
        "",
        "buy it",
        "click[B0BOTTLE03]",
        "click[next >]",
        "click[buy now]",
        "search[]",
        "click boots",
        "search[a] || search[b]",
        "click[" + "x" * 500 + "]",
        None,
        7,
    ],
)
def test_invalid_actions_get_the_format_penalty_and_change_nothing(boots, answer):
    before = boots.render()
    obs, reward_value, terminated, truncated, info = boots.step(answer)
    assert reward_value == -0.1 and not info["action_is_valid"] and not terminated
    assert obs == before and boots.actions_taken == 0


def test_pages_and_navigation(boots):
    instruction = (
        "Instruction: i need waterproof leather boots, black, size 9, and price lower "
        "than 50.00 dollars"
    )
    assert boots.render() == f"{instruction}\nSearch page. Actions: search[<query>]"
    obs = boots.step("Search[ Boots ]")[0]
    assert obs.splitlines() == [
        'Results for "Boots", page 1/1:',
        "B0WINTER04 Insulated Winter Boots $120",
        "B0BOOTS001 Waterproof Leather Hiking Boots for Men $45.99",
        "Actions: click[<id>], click[back to search]",
    ]
    assert not boots.step("search[boots]")[4]["action_is_valid"]  # only on the search page
    obs = boots.step("click[b0boots001]")[0]  # case-insensitive
    assert obs.splitlines() == [
        instruction,
        "Item B0BOOTS001: Waterproof Leather Hiking Boots for Men, $45.99",
        "color: black, brown",
        "size: 9, 10",
        "Chosen: none",
        "Actions: click[<option>], click[buy now], click[< prev], click[back to search]",
    ]
    boots.step("click[Brown]")
    obs = boots.step("click[9]")[0]
    assert (
        obs.splitlines()[0].startswith("Item B0BOOTS001") and "Chosen: color brown, size 9" in obs
    )
    assert "Chosen: color black, size 9" in boots.step("click[black]")[0]  # replaces the colour
    assert boots.step("click[< prev]")[0].startswith('Results for "Boots"')
    assert boots.step("click[back to search]")[0].endswith("search[<query>]")
    assert boots.actions_taken == 7
    assert boots.step("search[zzz]")[0] == 'No results for "zzz". Actions: click[back to search]'


def test_results_are_paged():
    env = WebShopEnv(results_per_page=2)
    env.reset(seed=0)
    env.step("search[boots]")
    assert "click[next >]" in env.render() and "click[< prev]" not in env.render()
    first_page = env.render()
    assert "page 2/3:" in env.step("click[next >]")[0] and "click[< prev]" in env.render()
    assert env.step("click[< prev]")[0] == first_page


def test_episode_is_truncated_after_the_action_budget():
    env = WebShopEnv(max_actions=3)
    env.reset(seed=1)
    env.step("search[boots]")
    env.step("click[next >]")
    _, reward_value, terminated, truncated, _ = env.step("click[< prev]")
    assert (reward_value, terminated, truncated) == (0.0, False, True)
    assert not env.step("click[back to search]")[4]["action_is_valid"]


def test_loader_reads_the_human_and_synthetic_instruction_formats(tmp_path):
    products = tmp_path / "items.json"
    products.write_text(json.dumps(ITEMS))
    human = tmp_path / "items_human_ins.json"
    human.write_text(
        json.dumps(
            {
                "B0BOOTS001": [
                    {
                        "asin": "B0BOOTS001",
                        "instruction": "i want brown boots.",
                        "instruction_attributes": ["waterproof"],
                        "instruction_options": ["brown", "10"],
                    }
                ]
            }
        )
    )
    shop = load_shop(str(products), str(human))
    goal = shop.goals[0]
    assert (goal.attributes, goal.options) == (("waterproof",), ("brown", "10"))
    assert goal.price_upper in (50.0, 60.0, 70.0, 80.0)  # WebShop: a multiple of 10 above $45.99
    assert (
        goal.instruction
        == f"i want brown boots, and price lower than {goal.price_upper:.2f} dollars"
    )
    synthetic = tmp_path / "items_ins_v2.json"
    synthetic.write_text(
        json.dumps(
            {
                "B0BOTTLE03": {
                    "attributes": ["bpa free", "leak proof"],
                    "instruction": "a leak proof bottle",
                    "instruction_attributes": ["leak proof"],
                }
            }
        )
    )
    shop = load_shop(str(products), str(synthetic))
    assert shop.product("B0BOTTLE03").attributes == ("bpa free", "leak proof")
    assert [p.price for p in shop.products] == [45.99, 60.0, 15.0, 120.0]
    assert shop.product("B0BOOTS001").options == {"color": ("black", "brown"), "size": ("9", "10")}
    assert shop.product("B0WINTER04").options["color"] == ("black | grey",)
    assert parse_product({"asin": "Z", "name": "n"}).price == 100.0  # WebShop's default
    with pytest.raises(ValueError, match="no instruction"):
        load_shop(str(products), str(tmp_path / "items.json"))
    with pytest.raises(ValueError, match="both"):
        WebShopEnv(products_path=str(products))


def test_search_ranks_by_bm25(shop_files):
    shop = load_shop(*shop_files)
    assert shop.search("water bottle")[0] == "B0BOTTLE03"
    assert shop.search("leather boots")[:2] == ("B0BOOTS001", "B0WINTER04")
    assert shop.search("zzz") == ()


def test_generated_catalogue_is_deterministic_and_varied():
    a, b = generated_shop(0, 16, 6), generated_shop.__wrapped__(0, 16, 6)
    assert a.products == b.products and len(a.products) == 96
    assert generated_shop.__wrapped__(1, 16, 6).products != a.products
    env1, env2 = WebShopEnv(), WebShopEnv()
    assert all(env1.reset(seed=s)[0] == env2.reset(seed=s)[0] for s in range(30))
    instructions = {env1.reset(seed=s)[1]["instruction"] for s in range(200)}
    assert len(instructions) >= 150
    assert len({p.query for p in a.products}) == 16 and len({p.asin for p in a.products}) == 96


def test_expert_solves_every_generated_goal():
    env = make("webshop")
    lengths = []
    for seed in range(150):
        _, info = env.reset(seed=seed)
        plan = env.solve()
        assert plan is not None and len(plan) == info["optimal_plan_length"] <= env.max_actions
        got, step_info = play(env, plan)
        assert got == 1.0 and step_info["success"], env.goal
        lengths.append(len(plan))
    assert 3 <= min(lengths) and max(lengths) <= 7


def test_stochasticity_replaces_actions_by_random_valid_ones():
    env = WebShopEnv(stochasticity=0.0)
    env.reset(seed=3)
    assert play(env, env.solve())[0] == 1.0
    searches, clicks = [], []
    for seed in range(200):
        first = []
        for requested in ("search[boots]", "search[red tea]"):
            env = WebShopEnv(stochasticity=1.0)
            env.reset(seed=seed)
            info = env.step(requested)[4]
            assert info["requested_actions"] == [requested]
            first.append(info["executed_actions"][0])
        assert first[0] == first[1]  # the request no longer matters
        searches.append(first[0])
        env.reset(seed=seed)
        env.view = View("results", "boots", 1)  # a results page: 3 items, next, back
        page_actions = env.valid_actions()
        clicks.append(env.step("click[back to search]")[4]["executed_actions"][0])
        assert clicks[-1] in page_actions
    assert set(searches) <= {f"search[{q}]" for q in env.shop.search_pool}
    assert len(set(searches)) >= 50  # uniform over the 96 queries of the pool
    counts = np.unique(clicks, return_counts=True)[1]
    assert len(counts) == len(page_actions) == 5 and counts.min() > 20


def test_demonstrations_are_grounded_and_noise_lowers_reward():
    env = WebShopEnv()
    rng = np.random.default_rng(0)
    env.reset(seed=1)
    assert env.goal.instruction == "Find hooded jacket, color black, size large, under $80."
    steps = []
    while not env.done:
        steps.append(env.demonstration(rng))
        env.step(steps[-1][1])
    assert steps == [
        ("Want hooded jacket under $80. Search it.", "search[hooded jacket]"),
        ("p021 hooded lightweight jacket $68 fits, under $80.", "click[p021]"),
        ("Need color black.", "click[black]"),
        ("Need size large.", "click[large]"),
        ("Chosen color black, size large. Buy.", "click[buy now]"),
    ]
    assert env.final_reward == 1.0
    mean_reward = {}
    for noise in (0.0, 1.0):
        rewards = []
        for seed in range(100):
            env.reset(seed=seed)
            reward_value = 0.0
            while not env.done and env.actions_left() > 0:
                reasoning, action = env.demonstration(rng, noise)
                assert len(reasoning.split()) <= 25
                reward_value = env.step(action)[1]
            rewards.append(reward_value)
        mean_reward[noise] = np.mean(rewards)
    assert mean_reward[0.0] == 1.0 and mean_reward[1.0] < 0.3


def test_fuzzy_matching_is_token_set_like():
    assert fuzzy_match("machine washable", "washable") and fuzzy_match("Navy Blue", "navy blue")
    assert not fuzzy_match("9", "10") and not fuzzy_match("12 oz", "16 oz")
    assert not fuzzy_match("", "x")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.text(max_size=30)
        | st.builds(
            lambda v, a: f"{v}[{a}]",
            st.sampled_from(["search", "click", "CLICK"]),
            st.text(max_size=20)
            | st.sampled_from(["next >", "< prev", "buy now", "back to search", "p000", "black"]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_step_never_raises(answers):
    env = WebShopEnv(stochasticity=0.3)
    env.reset(seed=len(answers))
    for answer in answers:
        obs, reward_value, terminated, truncated, info = env.step(answer)
        assert isinstance(obs, str) and -0.1 <= reward_value <= 1.0
        if not info["action_is_valid"]:
            assert reward_value == -0.1
    if not env.done and env.actions_left() > 0:
        env.demonstration(np.random.default_rng(0), 0.5)  # from any reachable page
        assert env.solve() is not None
