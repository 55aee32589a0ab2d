"""WebShop: search a shop, open items, choose options and buy what the instruction asks.

Multi-turn (at most 9 actions, one per turn).  Pages, as in WebShop's simple mode
but compact: the search page (``search[query]``), a results page (three items
per page with id, name and price; ``click[<id>]``, ``click[next >]``,
``click[< prev]``, ``click[back to search]``) and an item page (its option
groups and values; ``click[<value>]``, ``click[buy now]``, ``click[< prev]``,
``click[back to search]``).  Each page ends with its actions; the instruction
heads the search page and an item page's first view (see ``render``).  A click
on something not on the page, a search off the search page, two actions in one
turn, or any other text is invalid (format penalty, no step).  Clicks ignore
case.  Search ranks products by BM25 over their name, query and category.

Reward, on ``buy now`` (WebShop's scheme)::

    r = (attribute matches + option matches + [price <= price_upper])
        / (goal attributes + goal options + 1) * r_type

An attribute matches when a product attribute fuzzily matches it or it occurs
in the product's text; options match fuzzily after colour normalisation (a
difflib stand-in for thefuzz's ``token_set_ratio`` > 85).  ``r_type`` is 1 when
the product's type words (its name without stopwords and goal attribute/option
words, a stand-in for spaCy's nouns) overlap the goal product's by more than
0.2 or its query or two category levels match; 0.5 otherwise; 0.1 for an
overlap below 0.1 and 0 for none.  Success = a full match (r == 1).

Data: ``products_path`` is WebShop's product JSON (a list of items with
``asin``, ``name``, ``pricing``, ``customization_options`` or ``options``,
``product_category``, ``query``, ``category``, optional ``attributes``,
``small_description``/``full_description``) and ``goals_path`` its
instruction JSON: a list of goals (``asin``, ``instruction_text``,
``attributes``, ``goal_options``, ``price_upper``), the human instructions
(``{asin: [{instruction, instruction_attributes, instruction_options}]}``), or
the synthetic ones (``{asin: {instruction, instruction_attributes, attributes}}``,
whose ``attributes`` also become the product's).  Without paths: a generated
catalogue (``categories`` x ``products_per_category`` items; each has two
attributes from its category's pool, a subset of the category's options and a
price; seeded by ``catalogue_seed``), and each reset seed draws a goal from it.

Stochasticity (multi-turn, docs/methods.md section 11): with probability p the executed action is
replaced by a uniformly random valid action of the current page; on the search
page, whose action is free text, that is a search for one of ``search_pool``
(offline: the product types and attribute + type pairs; loaded: the products'
``query`` strings, at most 100).
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .base import ACTION_SEPARATOR, MultiTurnTextEnv

#: noun, category path, price range (dollars), attribute pool, option groups
CATALOGUE = (
    (
        "boots",
        "fashion › shoes › boots",
        (30, 120),
        ("waterproof", "leather", "insulated", "lightweight", "non slip"),
        {"color": ("black", "brown", "grey"), "size": ("7", "8", "9", "10")},
    ),
    (
        "sneakers",
        "fashion › shoes › sneakers",
        (20, 90),
        ("breathable", "lightweight", "cushioned", "canvas", "non slip"),
        {"color": ("white", "black", "blue", "red"), "size": ("7", "8", "9", "10")},
    ),
    (
        "hoodie",
        "fashion › clothing › hoodies",
        (15, 60),
        ("cotton", "fleece", "zip up", "oversized", "machine washable"),
        {"color": ("black", "grey", "green", "navy"), "size": ("small", "medium", "large", "xl")},
    ),
    (
        "jacket",
        "fashion › clothing › jackets",
        (40, 150),
        ("waterproof", "hooded", "windproof", "lightweight", "down"),
        {"color": ("black", "blue", "green", "red"), "size": ("small", "medium", "large", "xl")},
    ),
    (
        "mug",
        "home › kitchen › mugs",
        (8, 30),
        ("ceramic", "insulated", "dishwasher safe", "microwave safe", "glass"),
        {"color": ("white", "black", "blue"), "capacity": ("12 oz", "16 oz", "20 oz")},
    ),
    (
        "lamp",
        "home › lighting › lamps",
        (15, 70),
        ("led", "dimmable", "rechargeable", "touch control", "usb"),
        {"color": ("white", "black", "gold"), "pack": ("1 pack", "2 pack")},
    ),
    (
        "pillow",
        "home › bedding › pillows",
        (15, 80),
        ("memory foam", "cooling", "hypoallergenic", "washable", "firm"),
        {"size": ("standard", "queen", "king"), "pack": ("1 pack", "2 pack")},
    ),
    (
        "headphones",
        "electronics › audio › headphones",
        (20, 200),
        ("wireless", "noise cancelling", "bluetooth", "over ear", "foldable"),
        {"color": ("black", "white", "blue", "pink")},
    ),
    (
        "speaker",
        "electronics › audio › speakers",
        (20, 150),
        ("bluetooth", "waterproof", "portable", "bass boost", "rechargeable"),
        {"color": ("black", "blue", "red")},
    ),
    (
        "charger",
        "electronics › accessories › chargers",
        (10, 50),
        ("fast charging", "usb c", "wireless", "compact", "dual port"),
        {"color": ("black", "white"), "pack": ("1 pack", "2 pack", "3 pack")},
    ),
    (
        "backpack",
        "bags › backpacks",
        (25, 120),
        ("waterproof", "laptop", "lightweight", "anti theft", "large"),
        {"color": ("black", "grey", "blue", "green")},
    ),
    (
        "shampoo",
        "beauty › hair care › shampoo",
        (6, 40),
        ("sulfate free", "organic", "moisturizing", "anti dandruff", "vegan"),
        {"size": ("8 oz", "16 oz", "32 oz"), "scent": ("mint", "lavender", "coconut")},
    ),
    (
        "lotion",
        "beauty › skin care › lotion",
        (6, 35),
        ("fragrance free", "organic", "moisturizing", "vegan", "spf 30"),
        {"size": ("8 oz", "16 oz"), "scent": ("unscented", "vanilla", "coconut")},
    ),
    (
        "coffee",
        "grocery › beverages › coffee",
        (8, 45),
        ("organic", "decaf", "dark roast", "fair trade", "whole bean"),
        {"size": ("12 oz", "2 lb"), "pack": ("1 pack", "2 pack")},
    ),
    (
        "tea",
        "grocery › beverages › tea",
        (5, 30),
        ("organic", "herbal", "green", "caffeine free", "loose leaf"),
        {"flavor": ("mint", "lemon", "ginger", "peach"), "pack": ("20 bags", "50 bags")},
    ),
    (
        "socks",
        "fashion › clothing › socks",
        (8, 35),
        ("cotton", "wool", "ankle", "cushioned", "moisture wicking"),
        {"color": ("black", "white", "grey"), "pack": ("3 pack", "6 pack")},
    ),
)
COLOURS = (
    "beige",
    "black",
    "blue",
    "brown",
    "gold",
    "green",
    "grey",
    "gray",
    "ivory",
    "khaki",
    "navy",
    "orange",
    "pink",
    "purple",
    "red",
    "silver",
    "tan",
    "white",
    "yellow",
)
STOPWORDS = frozenset(
    "a an and are as at be by for from i in is it me my need of on or s the to "
    "with want find looking price lower than dollars under".split()
)
NEXT, PREV, BACK, BUY = "next >", "< prev", "back to search", "buy now"
ACTION = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)
MAX_QUERY_CHARS = 200
#: A search returns at most this many products (WebShop: 50, i.e. 5 pages of 10).
MAX_RESULTS = 50


def tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def fmt_price(price: float) -> str:
    return f"${price:.0f}" if float(price).is_integer() else f"${price:.2f}"


def fuzzy_match(a: str, b: str) -> bool:
    """Approximates thefuzz's ``token_set_ratio(a, b) > 85`` with difflib."""
    ta, tb = set(tokens(a)), set(tokens(b))
    if not ta or not tb:
        return False
    common = ta & tb
    if common and (common == ta or common == tb):
        return True
    t0 = " ".join(sorted(common))
    t1, t2 = (f"{t0} {' '.join(sorted(t - common))}".strip() for t in (ta, tb))
    ratio = max(
        difflib.SequenceMatcher(None, x, y).ratio() for x, y in ((t0, t1), (t0, t2), (t1, t2))
    )
    return ratio > 0.85


def normalise_colour(value: str) -> str:
    return next((c for c in COLOURS if c in value), value)


@dataclass(frozen=True)
class Product:
    asin: str
    name: str
    price: float
    options: dict[str, tuple[str, ...]]
    attributes: tuple[str, ...] = ()
    query: str = ""
    product_category: str = ""
    text: str = ""  # lower-cased name, bullet points and description (attribute matching)


@dataclass(frozen=True)
class Goal:
    asin: str
    instruction: str
    attributes: tuple[str, ...]
    options: tuple[str, ...]
    price_upper: float
    #: the words an expert searches for (offline: attributes + type)
    search_text: str = ""


@dataclass(frozen=True)
class View:
    """Where the agent is: ``page`` is search, results, item or done."""

    page: str = "search"
    query: str = ""
    page_no: int = 1
    asin: str = ""
    chosen: tuple[tuple[str, str], ...] = ()


def _levels(product: Product) -> set[str]:
    return {x.strip() for x in product.product_category.split("›") if x.strip()}


def type_reward(product: Product, goal: Goal, target: Product) -> float:
    """WebShop's ``r_type``: is ``product`` the kind of thing the goal's product is?"""
    query_match = bool(product.query) and product.query == target.query
    category_match = len(_levels(product) & _levels(target)) >= 2
    skip = STOPWORDS | {t for text in goal.attributes + goal.options for t in tokens(text)}
    desired = {t for t in tokens(target.name) if t not in skip}
    bought = {t for t in tokens(product.name) if t not in skip}
    title_score = len(desired & bought) / len(desired) if desired else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type


def reward(product: Product, chosen: dict[str, str], goal: Goal, target: Product) -> float:
    """WebShop's purchase reward of ``product`` bought with options ``chosen``."""
    attr_hits = sum(
        1
        for g in goal.attributes
        if any(fuzzy_match(p, g) for p in product.attributes) or g.lower() in product.text
    )
    bought = [normalise_colour(v) for v in chosen.values()]
    option_hits = sum(
        1 for g in goal.options if any(fuzzy_match(v, normalise_colour(g.lower())) for v in bought)
    )
    price_ok = 1.0 if product.price <= goal.price_upper else 0.0
    total = (attr_hits + option_hits + price_ok) / (len(goal.attributes) + len(goal.options) + 1)
    return total * type_reward(product, goal, target)


class Shop:
    """Products, goals and a BM25 index over the products' text."""

    def __init__(
        self,
        products: list[Product],
        goals: list[Goal],
        search_pool: list[str],
        max_results: int = MAX_RESULTS,
    ) -> None:
        self.products = tuple(products)
        self.by_asin = {p.asin.lower(): p for p in products}
        self.goals = tuple(g for g in goals if g.asin.lower() in self.by_asin)
        self.search_pool = tuple(search_pool) or ("item",)
        self.max_results = max_results
        docs = [tokens(f"{p.name} {p.query} {p.product_category}") for p in products]
        self._postings: dict[str, list[tuple[int, int]]] = {}
        for i, doc in enumerate(docs):
            for term, tf in Counter(doc).items():
                self._postings.setdefault(term, []).append((i, tf))
        self._lengths = [len(d) for d in docs]
        self._avg_length = max(1e-9, sum(self._lengths) / max(1, len(docs)))

    # The cache keeps the index alive, as its catalogue does anyway.
    @functools.lru_cache(maxsize=4096)  # noqa: B019
    def search(self, query: str) -> tuple[str, ...]:
        """Asins of the best ``max_results`` products for ``query`` (BM25, k1=1.5, b=0.75;
        ties keep catalogue order)."""
        n, scores = len(self.products), Counter()
        for term in set(tokens(query)) - STOPWORDS:
            postings = self._postings.get(term, [])
            idf = math.log(1 + (n - len(postings) + 0.5) / (len(postings) + 0.5))
            for i, tf in postings:
                norm = tf + 1.5 * (0.25 + 0.75 * self._lengths[i] / self._avg_length)
                scores[i] += idf * tf * 2.5 / norm
        ranked = sorted(scores, key=lambda i: (-scores[i], i))[: self.max_results]
        return tuple(self.products[i].asin for i in ranked)

    def product(self, asin: str) -> Product:
        return self.by_asin[asin.lower()]


# -- data -----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def generated_shop(catalogue_seed: int, categories: int, per_category: int) -> Shop:
    """The offline catalogue: the first ``categories`` kinds of ``CATALOGUE``."""
    rng = np.random.default_rng([catalogue_seed, 0x5409])
    products, pool = [], []
    for noun, path, (low, high), attributes, groups in CATALOGUE[:categories]:
        pool += [noun] + [f"{a} {noun}" for a in attributes]
        for _ in range(per_category):
            picked = sorted(rng.choice(len(attributes), size=2, replace=False))
            attrs = tuple(attributes[int(i)] for i in picked)
            options = {}
            for group, values in groups.items():
                k = int(rng.integers(2, len(values) + 1))
                keep = sorted(int(i) for i in rng.choice(len(values), size=k, replace=False))
                options[group] = tuple(values[i] for i in keep)
            name = f"{attrs[0]} {attrs[1]} {noun}"
            products.append(
                Product(
                    f"p{len(products):03d}",
                    name,
                    float(rng.integers(low, high + 1)),
                    options,
                    attrs,
                    noun,
                    path,
                    name,
                )
            )
    return Shop(products, [], pool)  # goals are drawn per reset by ``generated_goal``


def generated_goal(shop: Shop, rng: np.random.Generator) -> Goal:
    """A goal met by at least one product: the attributes, options and a price
    bound of a random product."""
    target = shop.products[int(rng.integers(len(shop.products)))]
    attrs = (
        target.attributes
        if rng.random() < 0.5
        else (target.attributes[int(rng.integers(len(target.attributes)))],)
    )
    options = {g: values[int(rng.integers(len(values)))] for g, values in target.options.items()}
    upper = float(10 * (int(target.price) // 10 + 1 + int(rng.integers(0, 3))))
    wanted = ", ".join(f"{g} {v}" for g, v in options.items())
    instruction = f"Find {' '.join(attrs)} {target.query}, {wanted}, under {fmt_price(upper)}."
    return Goal(
        target.asin,
        instruction,
        attrs,
        tuple(options.values()),
        upper,
        f"{' '.join(attrs)} {target.query}",
    )


def _price(pricing: Any) -> float:
    if isinstance(pricing, (int, float)):
        return float(pricing)
    if isinstance(pricing, list) and pricing:
        return _price(pricing[0])
    if isinstance(pricing, str):
        numbers = re.findall(r"\d+(?:\.\d+)?", pricing.replace(",", ""))
        if numbers:
            return float(numbers[0])
    return 100.0  # WebShop's default for a product without a price


def parse_product(item: dict, extra_attributes: dict[str, list] | None = None) -> Product | None:
    if not isinstance(item, dict) or not item.get("asin"):
        return None
    name = str(item.get("name") or item.get("Title") or item.get("title") or "")
    options: dict[str, tuple[str, ...]] = {}
    raw = item.get("options") or item.get("customization_options") or {}
    for group, values in raw.items() if isinstance(raw, dict) else []:
        cleaned = [
            " ".join(
                str(v.get("value", "") if isinstance(v, dict) else v)
                .replace("/", " | ")
                .lower()
                .split()
            )
            for v in (values or [])
        ]
        if any(cleaned):
            options[str(group).lower()] = tuple(v for v in cleaned if v)
    attributes = item.get("Attributes") or item.get("attributes") or []
    if extra_attributes and item["asin"] in extra_attributes:
        attributes = extra_attributes[item["asin"]]
    bullets = item.get("small_description") or item.get("BulletPoints") or ""
    bullets = " ".join(map(str, bullets)) if isinstance(bullets, list) else str(bullets)
    description = str(item.get("full_description") or item.get("Description") or "")
    return Product(
        str(item["asin"]),
        name,
        _price(item.get("pricing", item.get("price"))),
        options,
        tuple(str(a) for a in attributes if isinstance(a, str)),
        str(item.get("query") or "").lower().strip(),
        str(item.get("product_category") or ""),
        f"{name} {bullets} {description}".lower()[:4000],
    )


def _read_json(path: str) -> Any:
    text = Path(path).expanduser().read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except ValueError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def _goal_from(asin: str, entry: dict, product: Product | None, index: int) -> Goal | None:
    text = entry.get("instruction_text") or entry.get("instruction")
    if not isinstance(text, str) or not text.strip() or product is None:
        return None
    # a goal list names the goal's attributes "attributes"; WebShop's instruction files
    # use "instruction_attributes" ("attributes" there are the product's)
    attrs = entry.get("attributes") if "instruction_text" in entry else None
    attrs = attrs or entry.get("instruction_attributes") or []
    options = entry.get("goal_options", entry.get("instruction_options")) or []
    options = list(options.values()) if isinstance(options, dict) else list(options)
    upper = entry.get("price_upper")
    if not isinstance(upper, (int, float)) or upper <= 0:
        # WebShop draws the bound from the next multiples of 10 above the price.
        steps = 1 + np.random.default_rng([index, 0x9A1]).integers(0, 4)
        upper = float(10 * (int(product.price) // 10 + int(steps)))
        text = f"{text.strip().rstrip('.')}, and price lower than {upper:.2f} dollars"
    search = " ".join(t for t in tokens(text.split(", and price")[0]) if t not in STOPWORDS)
    return Goal(
        asin,
        text.strip(),
        tuple(map(str, attrs)),
        tuple(map(str, options)),
        float(upper),
        " ".join(search.split()[:8]),
    )


@functools.lru_cache(maxsize=4)
def load_shop(products_path: str, goals_path: str) -> Shop:
    """A shop from WebShop's product and instruction JSON files (see the module doc)."""
    items, raw_goals = _read_json(products_path), _read_json(goals_path)
    if not isinstance(items, list):
        raise ValueError(f"{products_path}: expected a JSON list of products")
    extra = {}
    if isinstance(raw_goals, dict):  # synthetic instructions carry the products' attributes
        extra = {
            a: v["attributes"]
            for a, v in raw_goals.items()
            if isinstance(v, dict) and isinstance(v.get("attributes"), list)
        }
    products = [p for item in items if (p := parse_product(item, extra)) is not None]
    by_asin = {p.asin: p for p in products}
    if isinstance(raw_goals, dict):
        entries = [
            (asin, e)
            for asin, value in raw_goals.items()
            for e in (value if isinstance(value, list) else [value])
        ]
    else:
        entries = [(str(g.get("asin", "")), g) for g in raw_goals if isinstance(g, dict)]
    goals = [
        g
        for i, (asin, e) in enumerate(entries)
        if isinstance(e, dict) and (g := _goal_from(asin, e, by_asin.get(asin), i)) is not None
    ]
    pool = sorted({p.query for p in products if p.query})[:100]
    shop = Shop(products, goals, pool)
    if not shop.goals:
        raise ValueError(f"{goals_path}: no instruction refers to a product of {products_path}")
    return shop


class WebShopEnv(MultiTurnTextEnv):
    """A compact WebShop: search, browse results, choose options, buy.

    Args:
        products_path, goals_path: WebShop's product and instruction JSON (both or
            neither; neither: the generated catalogue).
        catalogue_seed, categories, products_per_category: the generated catalogue
            (``categories`` <= 16 kinds of product).
        results_per_page: items per results page; max_results: results per search.
        stochasticity, format_penalty, max_turns, max_actions: as in
            ``MultiTurnTextEnv`` (one action per turn).
    """

    max_turns = 9
    max_actions_per_turn = 1
    max_actions = 9

    def __init__(
        self,
        products_path: str | None = None,
        goals_path: str | None = None,
        catalogue_seed: int = 0,
        categories: int = len(CATALOGUE),
        products_per_category: int = 6,
        results_per_page: int = 3,
        max_results: int = 15,
        stochasticity: float = 0.0,
        format_penalty: float = -0.1,
        max_turns: int | None = None,
        max_actions: int | None = None,
    ) -> None:
        super().__init__(stochasticity, format_penalty, max_turns, 1, max_actions)
        if (products_path is None) != (goals_path is None):
            raise ValueError("give both products_path and goals_path, or neither")
        if not 1 <= int(categories) <= len(CATALOGUE) or int(products_per_category) < 1:
            raise ValueError(
                f"categories must be in 1..{len(CATALOGUE)} and products_per_category at least 1"
            )
        if int(results_per_page) < 1 or not 1 <= int(max_results) <= MAX_RESULTS:
            raise ValueError(
                f"results_per_page must be positive and max_results in 1..{MAX_RESULTS}"
            )
        if products_path is None:
            self.shop = generated_shop(
                int(catalogue_seed), int(categories), int(products_per_category)
            )
        else:
            self.shop = load_shop(str(products_path), str(goals_path))
        self.results_per_page = int(results_per_page)
        self.max_results = int(max_results)
        self.goal: Goal | None = None
        self.view = View(page="done")
        self.final_reward: float | None = None
        self._potential_cache: dict[str, tuple[float, dict[str, str]]] = {}

    # -- pages ----------------------------------------------------------------------------
    def _results(self, query: str) -> tuple[str, ...]:
        return self.shop.search(query)[: self.max_results]

    def _page_items(self, view: View) -> tuple[tuple[str, ...], int]:
        asins = self._results(view.query)
        pages = max(1, math.ceil(len(asins) / self.results_per_page))
        start = (view.page_no - 1) * self.results_per_page
        return asins[start : start + self.results_per_page], pages

    def _clicks(self, view: View) -> list[str]:
        """Clickable labels of a results or item page, in display order."""
        if view.page == "results":
            items, pages = self._page_items(view)
            return [
                *items,
                *([NEXT] if view.page_no < pages else []),
                *([PREV] if view.page_no > 1 else []),
                BACK,
            ]
        if view.page == "item":
            product = self.shop.product(view.asin)
            return [v for values in product.options.values() for v in values] + [BUY, PREV, BACK]
        return []

    def valid_actions(self) -> tuple[str, ...]:
        """Every valid action of the current page (the search page: ``search_pool``)."""
        if self.done or self.goal is None:
            return ()
        if self.view.page == "search":
            return tuple(f"search[{q}]" for q in self.shop.search_pool)
        return tuple(f"click[{label}]" for label in self._clicks(self.view))

    @property
    def action_names(self) -> tuple[str, ...]:  # type: ignore[override]
        """The base class draws the stochastic replacement from these."""
        return self.valid_actions()

    def parse_actions(self, answer: str) -> list[str] | None:
        if (
            not isinstance(answer, str)
            or len(answer) > 2 * MAX_QUERY_CHARS
            or self.goal is None
            or ACTION_SEPARATOR in answer
        ):  # one action per turn
            return None
        match = ACTION.match(answer)
        if match is None:
            return None
        verb, arg = match.group(1).lower(), " ".join(match.group(2).split())
        if verb == "search":
            ok = self.view.page == "search" and 0 < len(arg) <= MAX_QUERY_CHARS
            return [f"search[{arg}]"] if ok else None
        lookup = {label.lower(): label for label in self._clicks(self.view)}
        label = lookup.get(arg.lower())
        return None if label is None else [f"click[{label}]"]

    def _next_view(self, view: View, action: str) -> View:
        verb, arg = action.split("[", 1)
        arg = arg[:-1]
        if verb == "search":
            return View("results", arg, 1)
        if arg == BACK:
            return View("search")
        if view.page == "results":
            if arg in (NEXT, PREV):
                return replace(view, page_no=view.page_no + (1 if arg == NEXT else -1))
            return replace(view, page="item", asin=arg, chosen=())
        if arg == PREV:
            return replace(view, page="results", asin="", chosen=())
        if arg == BUY:
            return replace(view, page="done")
        product = self.shop.product(view.asin)
        group = next(g for g, values in product.options.items() if arg in values)
        chosen = dict(view.chosen)
        chosen[group] = arg
        return replace(view, chosen=tuple(chosen.items()))

    def _apply(self, action_name: str) -> tuple[float, bool, bool]:
        self.view = self._next_view(self.view, action_name)
        if self.view.page != "done":
            return 0.0, False, False
        assert self.goal is not None
        self.final_reward = reward(
            self.shop.product(self.view.asin),
            dict(self.view.chosen),
            self.goal,
            self.shop.product(self.goal.asin),
        )
        return self.final_reward, True, self.final_reward >= 1.0 - 1e-9

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """New instruction named by ``seed``; ``options={"goal": Goal | index}`` fixes one."""
        rng = self._seed_level_rng(seed)
        chosen = (options or {}).get("goal")
        if isinstance(chosen, Goal):
            self.goal = chosen
        elif chosen is not None and self.shop.goals:
            self.goal = self.shop.goals[int(chosen) % len(self.shop.goals)]
        elif self.shop.goals:
            self.goal = self.shop.goals[int(rng.integers(len(self.shop.goals)))]
        else:
            self.goal = generated_goal(self.shop, rng)
        self.view, self.final_reward, self._potential_cache = View(), None, {}
        self._start_episode()
        return self._reset_result(goal_asin=self.goal.asin, instruction=self.goal.instruction)

    # -- expert -----------------------------------------------------------------------------
    def _potential(self, asin: str) -> tuple[float, dict[str, str]]:
        """The reward of buying ``asin`` with the options that best fit the goal."""
        if asin not in self._potential_cache:
            assert self.goal is not None
            product, chosen = self.shop.product(asin), {}
            for wanted in self.goal.options:
                for group, values in product.options.items():
                    hit = next(
                        (
                            v
                            for v in values
                            if group not in chosen
                            and fuzzy_match(normalise_colour(v), normalise_colour(wanted.lower()))
                        ),
                        None,
                    )
                    if hit is not None:
                        chosen[group] = hit
                        break
            value = reward(product, chosen, self.goal, self.shop.product(self.goal.asin))
            self._potential_cache[asin] = (value, chosen)
        return self._potential_cache[asin]

    def _queries(self) -> list[str]:
        assert self.goal is not None
        target = self.shop.product(self.goal.asin)
        return list(dict.fromkeys(q for q in (self.goal.search_text, target.name) if q.strip()))

    def _best(self) -> float:
        return max(
            (self._potential(a)[0] for q in self._queries() for a in self._results(q)), default=0.0
        )

    def _plan(self, view: View, depth: int = 0) -> list[str] | None:
        best = self._best()
        if view.page == "done" or depth > 4:
            return [] if view.page == "done" else None
        if view.page == "item":
            value, options = self._potential(view.asin)
            if value >= best - 1e-9:
                chosen = dict(view.chosen)
                clicks = [f"click[{v}]" for g, v in options.items() if chosen.get(g) != v]
                return clicks + [f"click[{BUY}]"]
            rest = self._plan(replace(view, page="results", asin="", chosen=()), depth + 1)
            return None if rest is None else [f"click[{PREV}]"] + rest
        if view.page == "results":
            asins = self._results(view.query)
            hits = [i for i, a in enumerate(asins) if self._potential(a)[0] >= best - 1e-9]
            on_page = [i for i in hits if i // self.results_per_page + 1 == view.page_no]
            if on_page:
                item = replace(view, page="item", asin=asins[on_page[0]], chosen=())
                return [f"click[{item.asin}]"] + (self._plan(item, depth + 1) or [])
            if hits:
                page = hits[0] // self.results_per_page + 1
                move = NEXT if page > view.page_no else PREV
                rest = self._plan(replace(view, page_no=page), depth + 1) or []
                return [f"click[{move}]"] * abs(page - view.page_no) + rest
            rest = self._plan(View("search"), depth + 1)
            return None if rest is None else [f"click[{BACK}]"] + rest
        for query in self._queries():
            if any(self._potential(a)[0] >= best - 1e-9 for a in self._results(query)):
                return [f"search[{query}]"] + (
                    self._plan(View("results", query, 1), depth + 1) or []
                )
        return None

    def solve(self) -> list[str] | None:
        """The expert's actions from the current page to the best reachable purchase."""
        if self.goal is None or self.done:
            return None
        return self._plan(self.view)

    # -- text -------------------------------------------------------------------------------
    def rules(self) -> str:
        return (
            "WebShop: buy what the instruction asks for. search[query] on the search page, "
            "click[id] an item, click[option] its options, then click[buy now]. Reward: share "
            "of attributes, options and price matched."
        )

    def _short_name(self, product: Product, words: int = 12) -> str:
        parts = product.name.split()
        return " ".join(parts[:words]) + (" ..." if len(parts) > words else "")

    def render(self) -> str:  # type: ignore[override]
        """The page.  The instruction heads the search page and the first view of an
        item page; the results page (right after a search) and an item page after an
        option click (right after the first view) leave it out: it is a turn above in
        the context, and pages stay near 50 tokens, so a 9-turn episode fits a
        1k-token context."""
        if self.goal is None:
            return "No instruction: call reset()."
        view, instruction = self.view, f"Instruction: {self.goal.instruction}"
        if view.page == "search":
            return f"{instruction}\nSearch page. Actions: search[<query>]"
        if view.page == "results":
            items, pages = self._page_items(view)
            if not items:
                return f'No results for "{view.query}". Actions: click[{BACK}]'
            lines = [f'Results for "{view.query}", page {view.page_no}/{pages}:']
            for asin in items:
                product = self.shop.product(asin)
                lines.append(
                    f"{product.asin} {self._short_name(product)} {fmt_price(product.price)}"
                )
            moves = [label for label in self._clicks(view) if label in (NEXT, PREV, BACK)]
            lines.append("Actions: " + ", ".join(f"click[{c}]" for c in ["<id>", *moves]))
            return "\n".join(lines)
        product = self.shop.product(view.asin)
        chosen = ", ".join(f"{g} {v}" for g, v in view.chosen) or "none"
        if view.page == "done":
            return (
                f"Bought {product.asin} {self._short_name(product)} for "
                f"{fmt_price(product.price)}, options: {chosen}. Reward {self.final_reward:.2f}."
            )
        lines = [instruction] if not view.chosen else []  # shown on the first view of the item
        lines.append(
            f"Item {product.asin}: {self._short_name(product)}, {fmt_price(product.price)}"
        )
        lines += [f"{g}: {', '.join(values)}" for g, values in product.options.items()]
        lines.append(f"Chosen: {chosen}")
        lines.append(
            "Actions: "
            + ("click[<option>], " if product.options else "")
            + f"click[{BUY}], click[{PREV}], click[{BACK}]"
        )
        return "\n".join(lines)

    def _explain(self, action: str, expert: bool) -> str:
        """Short reasoning that names what the action is about."""
        assert self.goal is not None
        verb, arg = action.split("[", 1)
        arg = arg[:-1]
        upper = fmt_price(self.goal.price_upper)
        if verb == "search":
            wanted = self.goal.search_text or " ".join(tokens(self.goal.instruction)[:8])
            return f"Want {wanted} under {upper}. " + (
                "Search it." if arg == wanted else f"Try {arg}."
            )
        if arg == BACK:
            return "Nothing fits here. Back to search." if expert else "Back to search."
        if self.view.page == "results":
            if arg in (NEXT, PREV):
                where = "Next page." if arg == NEXT else "Previous page."
                return f"Nothing fits on page {self.view.page_no}. {where}" if expert else where
            product = self.shop.product(arg)
            item = f"{arg} {self._short_name(product, 6)} {fmt_price(product.price)}"
            return f"{item} fits, under {upper}." if expert else f"Try {item}."
        product = self.shop.product(self.view.asin)
        if arg == PREV:
            return (
                f"{product.asin} does not fit. Back to results." if expert else "Back to results."
            )
        if arg == BUY:
            chosen = ", ".join(f"{g} {v}" for g, v in self.view.chosen) or "no options"
            return f"Chosen {chosen}. Buy." if expert else f"Buy {product.asin}."
        group = next(g for g, values in product.options.items() if arg in values)
        return f"Need {group} {arg}." if expert else f"Try {group} {arg}."

    def demonstration(self, rng: np.random.Generator, noise: float = 0.0) -> tuple[str, str]:
        """The expert's next action with reasoning naming the items, options and
        price involved; with probability ``noise`` a uniformly random valid action
        of the page instead."""
        assert self.goal is not None and not self.done
        plan = self.solve()
        if plan and rng.random() >= noise:
            return self._explain(plan[0], True), plan[0]
        actions = self.valid_actions()
        action = actions[int(rng.integers(len(actions)))]
        return self._explain(action, False), action
