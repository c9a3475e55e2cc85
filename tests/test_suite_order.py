"""The order the suite's two workers take its modules in (helpers.longest_modules_first)."""

from dataclasses import dataclass, field
from pathlib import Path

from helpers import LONGEST_FIRST, longest_modules_first


@dataclass
class Item:
    """What the ordering reads of a collected test: its module's path and its markers."""

    path: Path
    name: str
    markers: set = field(default_factory=set)

    def get_closest_marker(self, name):
        return name if name in self.markers else None


def collection(spec: dict[str, list[bool]]) -> list[Item]:
    """Tests in collection order: module name -> whether each of its tests is slow."""
    return [Item(Path("tests") / module, f"{module}::{i}", {"slow"} if slow else set())
            for module, tests in spec.items() for i, slow in enumerate(tests)]


def modules(items: list[Item]) -> list[str]:
    return [name for i, name in enumerate(item.path.name for item in items)
            if i == 0 or items[i - 1].path.name != name]


def test_long_modules_go_first_then_slow_ones_and_each_module_stays_whole_and_in_order():
    long_last, long_first = LONGEST_FIRST[-1], LONGEST_FIRST[0]
    items = collection({"test_a.py": [False, False], "test_b.py": [False, True, False], long_last: [True],
                        "test_c.py": [False], long_first: [False, True, True], "test_d.py": [True]})
    ordered = longest_modules_first(items)

    assert sorted(ordered, key=lambda i: i.name) == sorted(items, key=lambda i: i.name)  # nothing lost or added
    assert modules(ordered) == [long_first, long_last, "test_b.py", "test_d.py", "test_a.py", "test_c.py"]
    for module in modules(items):  # each module once, its tests in their collected order
        assert [i.name for i in ordered if i.path.name == module] == [i.name for i in items if i.path.name == module]


def test_a_collection_without_long_or_slow_modules_keeps_its_order():
    items = collection({"test_z.py": [False], "test_a.py": [False, False], "test_m.py": [False]})
    assert longest_modules_first(items) == items
