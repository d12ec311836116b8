"""Exclude patterns (issue 30): gitignore's rules on paths relative to a source's root,
the built-in credential defaults, the limits, and a hostile pattern that would make a
backtracking matcher run for ages."""

from __future__ import annotations

import pytest

from retrieval.extraction._exclude import (
    DEFAULT_EXCLUDES,
    ExcludeError,
    ExcludeRules,
    check_patterns,
)

CASES = [
    # (patterns, path, is_dir, excluded)
    (["*.pem"], "server.pem", False, True),
    (["*.pem"], "deep/er/server.pem", False, True),
    (["*.pem"], "server.pem.md", False, False),
    (["private"], "private", True, True),                # a name at any depth
    (["private"], "notes/private", True, True),
    (["private"], "notes/private.md", False, False),
    (["private/"], "private", False, False),             # directories only
    (["private/"], "private", True, True),
    (["/build"], "build", True, True),                   # anchored at the root
    (["/build"], "src/build", True, False),
    (["docs/private"], "docs/private", True, True),      # a middle slash anchors too
    (["docs/private"], "x/docs/private", True, False),
    (["docs/*.md"], "docs/a.md", False, True),
    (["docs/*.md"], "docs/sub/a.md", False, False),      # * stays in one component
    (["**/keys"], "a/b/keys", True, True),
    (["**/keys"], "keys", True, True),
    (["vault/**"], "vault/x/y.md", False, True),
    (["a/**/b.md"], "a/b.md", False, True),
    (["a/**/b.md"], "a/x/y/b.md", False, True),
    (["a/**/b.md"], "c/a/b.md", False, False),
    (["note?.md"], "note1.md", False, True),
    (["note?.md"], "note12.md", False, False),
    (["[abc].md"], "b.md", False, True),
    (["[!abc].md"], "b.md", False, False),
    (["*.md", "!keep.md"], "keep.md", False, False),     # the last match decides
    (["!keep.md", "*.md"], "keep.md", False, True),
    (["\\!bang.md"], "!bang.md", False, True),           # escaped leading characters
    (["\\#hash.md"], "#hash.md", False, True),
    (["# a comment", "", "   "], "# a comment", False, False),
    (["trailing.md   "], "trailing.md", False, True),
]


@pytest.mark.parametrize(("patterns", "path", "is_dir", "excluded"), CASES)
def test_gitignore_rules(patterns: list[str], path: str, is_dir: bool,
                         excluded: bool) -> None:
    assert ExcludeRules(patterns).excluded(path, is_dir=is_dir) is excluded


@pytest.mark.parametrize(("path", "is_dir"), [
    ("tls/server.pem", False), ("ssh/id_ed25519", False), ("ssh/id_rsa.pub", False),
    ("vault.kdbx", False), (".env", False), ("app/.env.production", False),
    ("home/.ssh", True), ("infra/terraform.tfstate", False), ("site.key", False),
    ("deploy/credentials", False), (".git-credentials", False),
])
def test_defaults_keep_keys_and_credentials_out(path: str, is_dir: bool) -> None:
    assert ExcludeRules(DEFAULT_EXCLUDES).excluded(path, is_dir=is_dir)


@pytest.mark.parametrize("path", ["runbooks/tls.md", "keys.md", "docs/credentials.md",
                                  "identity.md", "env.md", "pem/README.md"])
def test_defaults_leave_documents_about_them_alone(path: str) -> None:
    assert not ExcludeRules(DEFAULT_EXCLUDES).excluded(path)


def test_a_default_can_be_included_again() -> None:
    rules = ExcludeRules([*DEFAULT_EXCLUDES, "!examples/demo.key"])
    assert not rules.excluded("examples/demo.key")
    assert rules.excluded("prod/real.key")


def test_limits_and_control_characters_are_refused_naming_the_option() -> None:
    with pytest.raises(ExcludeError, match=r"at most 2 \(retrieval.max_exclude_patterns\)"):
        check_patterns(["a", "b", "c"], max_patterns=2, max_chars=100)
    with pytest.raises(ExcludeError, match=r"retrieval.max_exclude_chars"):
        check_patterns(["x" * 40], max_patterns=2, max_chars=32)
    with pytest.raises(ExcludeError, match=r"pattern 2 holds a control character"):
        check_patterns(["ok", "two\nlines"], max_patterns=2, max_chars=100)
    check_patterns(["ok", "x" * 30], max_patterns=2, max_chars=32)


def test_a_hostile_pattern_costs_its_length_times_the_paths() -> None:
    """A backtracking glob matcher takes exponential time on this pair (each ``*`` may
    take any share of the a's); here each component is matched without backtracking,
    and the path's components by a bounded table, so it ends at once (the tier's
    timeout would catch a matcher that did not)."""
    rules = ExcludeRules(["*a" * 40 + "*b", "/**/" * 30 + "z"])
    name = "a" * 255
    path = "/".join([name] * 40)
    assert not rules.excluded(path)
    assert not rules.excluded(path, is_dir=True)
