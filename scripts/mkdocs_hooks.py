"""MkDocs hooks (mkdocs.yml `hooks:`): pages that live outside docs/ join the site.

The README, CONTRIBUTING.md, benchmarks/RESULTS.md and its history stay where a reader of
the repository finds them, and their links stay repository-relative (`docs/methods.md`,
`../benchmarks/RESULTS.md`), so they work when read in the repository. For the site each
such file is added under a site path (`SITE_PATHS`), and every page's relative links are
rewritten from repository paths to site paths. A link whose target is neither a site page
nor a file in the repository is left as written, so `mkdocs build --strict` reports it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
# repository path -> site path, for the files outside docs/ that the site shows
SITE_PATHS = {
    "README.md": "quickstart.md",
    "CONTRIBUTING.md": "contributing.md",
    "benchmarks/RESULTS.md": "benchmarks/RESULTS.md",
    # every figure under benchmarks/ (the results and the README link them)
    **{
        str(p.relative_to(ROOT)): str(p.relative_to(ROOT))
        for p in sorted((ROOT / "benchmarks").rglob("*.png"))
    },
    **{
        f"benchmarks/history/{p.name}": f"benchmarks/history/{p.name}"
        for p in sorted((ROOT / "benchmarks" / "history").glob("*.md"))
    },
}
LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def on_config(config):
    """Every page in benchmarks/history/ joins the "Benchmark results" section of the nav.

    The nav in mkdocs.yml lists only the current results; a history page added on a new day
    joins the site without an edit to mkdocs.yml (which strict mode would otherwise demand).
    """
    history = sorted(s for s in SITE_PATHS.values() if s.startswith("benchmarks/history/"))
    for item in config["nav"] or []:
        if isinstance(item, dict) and "Benchmark results" in item:
            listed = {
                next(iter(e.values())) for e in item["Benchmark results"] if isinstance(e, dict)
            }
            item["Benchmark results"] += [
                {f"History {posixpath.basename(s)[:-3]}": s} for s in history if s not in listed
            ]
    return config


def on_files(files, config):
    for repo_path, site_path in SITE_PATHS.items():
        files.append(File.generated(config, site_path, abs_src_path=str(ROOT / repo_path)))
    return files


def _repo_path(site_path: str) -> str:
    """The repository path of a site page."""
    for repo, site in SITE_PATHS.items():
        if site == site_path:
            return repo
    return f"docs/{site_path}"


def on_page_markdown(markdown, page, config, files):
    page_repo_dir = posixpath.dirname(_repo_path(page.file.src_uri))
    page_site_dir = posixpath.dirname(page.file.src_uri)
    site_of = {repo: site for repo, site in SITE_PATHS.items()}

    def rewrite(match: re.Match) -> str:
        target = match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
            return match.group(0)  # a URL, an anchor on this page, or an absolute path
        path, _, anchor = target.partition("#")
        repo = posixpath.normpath(posixpath.join(page_repo_dir, path))
        site = site_of.get(repo) or (repo[len("docs/") :] if repo.startswith("docs/") else None)
        if site is None:
            return match.group(0)
        new = posixpath.relpath(site, page_site_dir or ".")
        return f"{match.group(1)}{new}{'#' + anchor if anchor else ''}{match.group(3)}"

    return LINK.sub(rewrite, markdown)
