#!/usr/bin/env python3
"""Tests of `.ci/module-circles` on tiny crates written to a temporary directory: a circle
through a root re-export, through `super::`, none (with every kind of test-only code and
literal that must not count), and the command line's exit codes.

Run: python3 .ci/test_module_circles.py
"""
import contextlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "module-circles")


def load():
    loader = importlib.machinery.SourceFileLoader("module_circles", SCRIPT)
    spec = importlib.util.spec_from_loader("module_circles", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


mc = load()


@contextlib.contextmanager
def crate(files):
    """A `src/` directory holding `files` (path -> Rust source)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        for path, text in files.items():
            full = os.path.join(src, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(textwrap.dedent(text).lstrip("\n"))
        yield src


def edges_of(src):
    mods, edges = mc.graph(src)
    return mods, {e: sorted(set(uses)) for e, uses in edges.items()}


def run(*roots):
    return subprocess.run(
        [sys.executable, SCRIPT, *roots], capture_output=True, text=True, check=False
    )


class ReExports(unittest.TestCase):
    def test_a_circle_through_a_root_reexport_is_found_with_the_path_that_makes_it(self):
        files = {
            "lib.rs": """
                mod a;
                mod b;
                pub use crate::a::Thing;
            """,
            "a.rs": """
                use crate::b::helper;
                pub struct Thing;
            """,
            "b.rs": """
                pub fn helper() -> crate::Thing {
                    crate::Thing
                }
            """,
        }
        with crate(files) as src:
            mods, edges = edges_of(src)
            self.assertEqual(mods, {"a", "b"})
            self.assertEqual(mc.circles(mods, edges), [["a", "b"]])
            self.assertEqual(edges[("a", "b")], [("a.rs", 1, "crate::b::helper")])
            self.assertEqual(
                edges[("b", "a")],
                [
                    ("b.rs", 1, "crate::Thing (re-exported by the root)"),
                    ("b.rs", 2, "crate::Thing (re-exported by the root)"),
                ],
            )
            out = run(src)
            self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
            self.assertIn("circle of 2 modules: a b", out.stdout)
            self.assertIn("a shortest cycle: a -> b -> a", out.stdout)
            self.assertIn(f"{os.path.join(src, 'b.rs')}:1: crate::Thing (re-exported by the root)", out.stdout)
            self.assertTrue(out.stdout.endswith("module circles found\n"), out.stdout)

    def test_grouped_renamed_gated_and_glob_reexports_resolve_to_their_modules(self):
        files = {
            "lib.rs": """
                mod a;
                mod b;
                mod c;
                mod d;
                mod e;
                #[cfg(feature = "x")]
                pub use crate::{a::{Alpha, Beta as Renamed}, c::{self, Gamma}};
                #[cfg(not(feature = "x"))]
                pub(crate) use e::Alpha;
                pub use d::*;
                pub type Own = u8;
            """,
            "a.rs": "pub struct Alpha; pub struct Beta;",
            "b.rs": """
                use crate::{Renamed, Gamma as G};
                fn f(_: crate::Alpha, _: crate::Delta, _: crate::Own) {}
                fn g() { $crate::c::h() }
            """,
            "c.rs": "pub struct Gamma; pub fn h() {}",
            "d.rs": "pub struct Delta;",
            "e.rs": "pub struct Alpha;",
        }
        with crate(files) as src:
            mods, edges = edges_of(src)
            self.assertEqual(
                sorted(edges),
                [("b", "a"), ("b", "c"), ("b", "d"), ("b", "e")],
                "Alpha under either cfg; Delta through the glob; Own is the root's",
            )
            self.assertEqual(
                edges[("b", "c")],
                [
                    ("b.rs", 1, "crate::Gamma (re-exported by the root)"),
                    ("b.rs", 3, "crate::c::h"),
                ],
            )
            self.assertEqual(edges[("b", "a")][-1], ("b.rs", 2, "crate::Alpha (re-exported by the root)"))
            self.assertEqual(mc.circles(mods, edges), [])

    def test_a_glob_of_the_root_counts_the_root_names_the_module_uses(self):
        files = {
            "lib.rs": "mod a; mod b; pub use b::Thing;",
            "a.rs": """
                use super::*;
                fn f(_: Thing) {}
            """,
            "b.rs": "pub struct Thing; fn g() { let _ = crate::a::f; }",
        }
        with crate(files) as src:
            mods, edges = edges_of(src)
            self.assertEqual(edges[("a", "b")], [("a.rs", 2, "Thing (through super::*)")])
            self.assertEqual(mc.circles(mods, edges), [["a", "b"]])


class Super(unittest.TestCase):
    def test_a_circle_through_super_paths_is_found(self):
        files = {
            "lib.rs": "mod a; mod b; mod c; mod d;",
            "a/mod.rs": "mod inner; pub struct Y;",
            "a/inner.rs": "use super::super::b::X;\nuse super::Y;",
            "b.rs": "pub struct X; fn f(_: crate::a::Y) {}",
            # An inline module is a level too; from a top-level file, `super` is the root.
            "c.rs": """
                mod deep {
                    use super::super::d::Z;
                    use super::Local;
                }
                struct Local;
            """,
            "d.rs": "pub struct Z; use super::b::X;",
        }
        with crate(files) as src:
            mods, edges = edges_of(src)
            self.assertEqual(sorted(edges), [("a", "b"), ("b", "a"), ("c", "d"), ("d", "b")])
            self.assertEqual(edges[("a", "b")], [("a/inner.rs", 1, "super::super::b::X")])
            self.assertEqual(edges[("c", "d")], [("c.rs", 2, "super::super::d::Z")])
            self.assertEqual(edges[("d", "b")], [("d.rs", 1, "super::b::X")])
            self.assertEqual(mc.circles(mods, edges), [["a", "b"]])
            out = run(src)
            self.assertEqual(out.returncode, 1, out.stdout)
            self.assertIn(f"{os.path.join(src, 'a', 'inner.rs')}:1: super::super::b::X", out.stdout)


class NoCircle(unittest.TestCase):
    # b names a only in test-only code, comments and literals: none of it counts.
    FILES = {
        "lib.rs": """
            mod a;
            mod b;
            mod c;
            #[cfg(test)]
            mod testing;
            pub use a::X;
        """,
        "a.rs": "use crate::b::Y;\npub struct X;",
        "b.rs": r'''
            //! Docs name [`crate::X`] and [`X`](crate::a::X).
            use crate::c::Z;
            /* crate::a::X /* nested */ crate::a::X */
            pub struct Y<'a>(&'a str);
            const S: &str = "crate::a::X \" crate::X";
            const R: &str = r#"crate::a::X "quoted""#;
            const C: char = '{';
            const Q: char = '\'';
            #[cfg(test)]
            fn helper() -> crate::X { crate::X }
            #[cfg(all(test, loom))]
            mod loom_tests;
            #[cfg(test)]
            #[allow(dead_code)]
            mod more {
                fn f<'a>(x: &'a str) -> char { '}' }
                use crate::a::X;
            }
            // Not test-only: `any(test, ...)` is built without tests too.
            #[cfg(any(test, feature = "z"))]
            pub fn counted(_: crate::c::W) {}
            #[cfg(test)]
            mod tests {
                use super::*;
                use crate::a::X;
            }
        ''',
        "b/loom_tests.rs": "use crate::a::X;",
        "b/tests.rs": "use crate::a::X;",
        "b/tests/helpers.rs": "use crate::a::X;",
        "c.rs": "pub struct Z; pub struct W;",
        "testing.rs": "use crate::b::Y; use crate::a::X;",
        "d/tests.rs": "use crate::a::X;",
        "e.rs": "#![cfg(test)]\nuse crate::a::X;",
        "bin/tool.rs": "use crate::a::X;",
        "main.rs": "mod b; use crate::b::Y;",
    }

    def test_test_only_code_comments_and_literals_make_no_edge(self):
        with crate(self.FILES) as src:
            mods, edges = edges_of(src)
            self.assertEqual(mods, {"a", "b", "c"})
            self.assertEqual(sorted(edges), [("a", "b"), ("b", "c")])
            self.assertEqual(
                edges[("b", "c")],
                [("b.rs", 2, "crate::c::Z"), ("b.rs", 21, "crate::c::W")],
            )
            self.assertEqual(mc.circles(mods, edges), [])

    def test_the_command_line_says_no_circles_and_exits_0(self):
        with crate(self.FILES) as src:
            out = run(src, src)
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
            self.assertEqual(
                out.stdout,
                f"{src}: no circles (3 modules, 2 edges)\n" * 2 + "no circles\n",
            )

    def test_a_missing_directory_or_no_argument_is_an_error(self):
        self.assertEqual(run("/nonexistent/src").returncode, 2)
        self.assertEqual(run().returncode, 2)


if __name__ == "__main__":
    unittest.main()
