"""The generated files are what scripts/generate.py writes from
api/openapi.json today (as clients/typescript checks src/schema.ts)."""

import importlib.util
import pathlib
import tempfile
import typing
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_generator():
    spec = importlib.util.spec_from_file_location("creditd_generate", ROOT / "scripts" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class GeneratedTest(unittest.TestCase):
    def test_up_to_date(self):
        gen = load_generator()
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(gen.main(["--out", tmp]), 0)
            for name in ("types_gen.py", "operations_gen.py"):
                with self.subTest(name):
                    fresh = (pathlib.Path(tmp) / name).read_text(encoding="utf-8")
                    committed = (ROOT / "creditd" / name).read_text(encoding="utf-8")
                    self.assertTrue(fresh == committed,
                                    f"creditd/{name} is stale: run `python3 scripts/generate.py` in clients/python and commit it")

    def test_types_resolve(self):
        # Every annotation names a declared type, and NotRequired marks what
        # the schema leaves out of required.
        from creditd import types_gen

        for name in types_gen.__all__:
            obj = getattr(types_gen, name)
            if isinstance(obj, type):
                typing.get_type_hints(obj)
        self.assertIn("external_id", types_gen.CreateCustomerInput.__required_keys__)
        self.assertIn("display_name", types_gen.CreateCustomerInput.__optional_keys__)
        self.assertIn("from", types_gen.UsageBucketsReport.__required_keys__)

    def test_every_tenant_operation_has_a_method(self):
        import json

        import creditd

        spec = json.loads((ROOT.parents[1] / "api" / "openapi.json").read_text(encoding="utf-8"))
        gen = load_generator()
        for path, item in spec["paths"].items():
            if not path.startswith("/v1/"):
                continue
            for m in ("get", "put", "post", "delete", "patch"):
                op = item.get(m)
                if op and not any("text/event-stream" in (r.get("content") or {}) for r in op["responses"].values()):
                    with self.subTest(op["operationId"]):
                        self.assertTrue(callable(getattr(creditd.Client, gen.method_name(op["operationId"]), None)))


if __name__ == "__main__":
    unittest.main()
