"""Deterministic content of the company database, and its atomic creation on disk.

Two presets: ``tutorial`` is the tutorial's exact 5 departments / 15 employees / 8 projects;
``default`` is a larger, realistic company drawn from a seeded ``random.Random`` (8
departments in 4 cities, 150 employees with role ladders, location-adjusted salaries and
hire dates over ten years, 40 projects with mixed statuses, some without a lead) so that
questions need JOINs, GROUP BY, filters and date arithmetic. Same seed, same bytes of data.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mcprl_mcp_server.db.schema import SCHEMA_SQL, SCHEMA_VERSION, TABLES

Department = tuple[int, str, str, float]  # id, name, location, budget
Employee = tuple[int, str, int, str, float, str]  # id, name, dept, role, salary, hire_date
Project = tuple[int, str, int, int | None, str, float]  # id, name, dept, lead, status, budget


@dataclass(frozen=True)
class CompanyData:
    departments: list[Department] = field(default_factory=list)
    employees: list[Employee] = field(default_factory=list)
    projects: list[Project] = field(default_factory=list)


# --- the tutorial preset: exact rows -----------------------------------------------------

TUTORIAL_DEPARTMENTS: list[Department] = [
    (1, "Engineering", "San Francisco", 2_500_000.0),
    (2, "Marketing", "New York", 800_000.0),
    (3, "Data Science", "San Francisco", 1_200_000.0),
    (4, "Sales", "New York", 950_000.0),
    (5, "Operations", "London", 600_000.0),
]
TUTORIAL_EMPLOYEES: list[Employee] = [
    (1, "Alice Johnson", 1, "Senior Engineer", 145_000.0, "2019-03-15"),
    (2, "Bob Smith", 1, "Software Engineer", 110_000.0, "2021-06-01"),
    (3, "Carol Williams", 1, "Engineering Manager", 175_000.0, "2017-01-10"),
    (4, "David Brown", 2, "Marketing Manager", 120_000.0, "2018-05-20"),
    (5, "Eva Martinez", 2, "Content Strategist", 85_000.0, "2022-02-14"),
    (6, "Frank Lee", 3, "Data Scientist", 130_000.0, "2020-08-03"),
    (7, "Grace Kim", 3, "Senior Data Scientist", 155_000.0, "2018-11-12"),
    (8, "Henry Davis", 3, "ML Engineer", 140_000.0, "2021-09-27"),
    (9, "Irene Garcia", 4, "Sales Director", 160_000.0, "2016-04-18"),
    (10, "Jack Wilson", 4, "Account Executive", 95_000.0, "2022-07-05"),
    (11, "Karen Taylor", 4, "Sales Representative", 78_000.0, "2023-01-09"),
    (12, "Liam Anderson", 5, "Operations Manager", 115_000.0, "2019-10-21"),
    (13, "Mia Thomas", 5, "Logistics Coordinator", 82_000.0, "2022-03-30"),
    (14, "Noah Jackson", 1, "DevOps Engineer", 125_000.0, "2020-12-07"),
    (15, "Olivia White", 2, "SEO Specialist", 88_000.0, "2021-04-19"),
]
TUTORIAL_PROJECTS: list[Project] = [
    (1, "Platform Rewrite", 1, 3, "active", 500_000.0),
    (2, "Mobile App v2", 1, 1, "active", 300_000.0),
    (3, "Brand Refresh", 2, 4, "completed", 150_000.0),
    (4, "Churn Prediction Model", 3, 7, "active", 200_000.0),
    (5, "Recommendation Engine", 3, 6, "on_hold", 250_000.0),
    (6, "Enterprise Sales Push", 4, 9, "active", 180_000.0),
    (7, "Warehouse Automation", 5, 12, "completed", 220_000.0),
    (8, "Q3 Campaign", 2, 5, "on_hold", 90_000.0),
]


def tutorial_data() -> CompanyData:
    return CompanyData(TUTORIAL_DEPARTMENTS, TUTORIAL_EMPLOYEES, TUTORIAL_PROJECTS)


# --- the default preset: a seeded, realistic company -------------------------------------

N_EMPLOYEES = 150
N_PROJECTS = 40
LOCATION_PAY = {"San Francisco": 1.15, "New York": 1.10, "London": 0.95, "Berlin": 0.90}

def _words(text: str) -> list[str]:
    return text.split()


# name, location, headcount weight, head's title, [(role, base salary, weight)], project kinds
_DEPARTMENTS: list[tuple[str, str, float, str, list[tuple[str, int, float]], list[str]]] = [
    ("Engineering", "San Francisco", 0.26, "VP of Engineering",
     [("Software Engineer", 125_000, 5), ("Senior Software Engineer", 160_000, 4),
      ("Staff Engineer", 195_000, 1.5), ("Engineering Manager", 185_000, 1.5),
      ("DevOps Engineer", 135_000, 2), ("QA Engineer", 105_000, 1.5)],
     ["Platform", "Migration", "API", "Infrastructure", "Mobile App"]),
    ("Data Science", "San Francisco", 0.10, "Head of Data Science",
     [("Data Scientist", 135_000, 4), ("Senior Data Scientist", 165_000, 2.5),
      ("ML Engineer", 150_000, 2.5), ("Data Analyst", 98_000, 3)],
     ["Model", "Forecast", "Pipeline", "Experimentation"]),
    ("Product", "New York", 0.08, "VP of Product",
     [("Product Manager", 140_000, 4), ("Senior Product Manager", 168_000, 2),
      ("Product Analyst", 102_000, 2)],
     ["Launch", "Roadmap", "Onboarding"]),
    ("Design", "Berlin", 0.07, "Head of Design",
     [("Product Designer", 105_000, 4), ("Senior Product Designer", 128_000, 2),
      ("UX Researcher", 98_000, 2)],
     ["Redesign", "Design System", "Research Study"]),
    ("Marketing", "New York", 0.12, "Head of Marketing",
     [("Marketing Specialist", 82_000, 4), ("Content Strategist", 88_000, 3),
      ("SEO Specialist", 86_000, 2), ("Marketing Manager", 122_000, 2)],
     ["Campaign", "Brand Refresh", "Website", "Webinar Series"]),
    ("Sales", "London", 0.17, "Sales Director",
     [("Sales Representative", 72_000, 5), ("Account Executive", 98_000, 4),
      ("Senior Account Executive", 125_000, 2), ("Sales Manager", 140_000, 1.5)],
     ["Expansion", "Partner Program", "Enterprise Push"]),
    ("Customer Success", "London", 0.10, "Head of Customer Success",
     [("Support Specialist", 60_000, 5), ("Customer Success Manager", 84_000, 3),
      ("Support Team Lead", 96_000, 1.5)],
     ["Help Center", "Retention Program", "Support Tooling"]),
    ("Operations", "Berlin", 0.10, "Operations Director",
     [("Operations Analyst", 76_000, 4), ("Logistics Coordinator", 68_000, 3),
      ("Finance Analyst", 88_000, 2), ("Operations Manager", 112_000, 1.5)],
     ["Automation", "Vendor Consolidation", "Audit", "Office Move"]),
]  # fmt: skip
_FIRST = _words(
    "Aaron Abigail Adam Aisha Alan Alice Amara Amelia Andre Anna Arjun Ava Ben Bianca Carla "
    "Carlos Chen Chloe Daniel Diana Dmitri Elena Eli Emma Ethan Fatima Felix Fiona Gabriel "
    "Grace Hannah Hiro Ian Ines Isaac Jada James Jonas Julia Kai Karen Kofi Lara Leo Lina "
    "Lucas Maya Mateo Mei Nadia Nina Noah Olga Omar Paula Priya Rafael Rosa Sam Sara Sofia "
    "Tariq Tom Uma Victor Wei Yara Yusuf Zoe"
)
_LAST = _words(
    "Abbott Adeyemi Alvarez Bauer Becker Brooks Campbell Chen Costa Dubois Edwards Fischer "
    "Garcia Gupta Hansen Hoffmann Ito Jensen Johnson Kaur Khan Kim Kowalski Larsen Lee Lopez "
    "Martin Meyer Moreau Murphy Nakamura Nguyen Novak Okafor Olsen Patel Petrov Reyes Rossi "
    "Santos Schmidt Silva Singh Smith Sousa Suzuki Tanaka Taylor Torres Wagner Walker Weber "
    "Williams Wong Yilmaz Young Zhang"
)
_CODENAMES = _words(
    "Atlas Beacon Cascade Comet Compass Delta Ember Falcon Fjord Galaxy Harbor Horizon "
    "Juniper Kestrel Lighthouse Lumen Meridian Nimbus Nova Orbit Orion Pioneer Polaris Quartz "
    "Raven Sequoia Sierra Solstice Summit Tempest Titan Vanguard Vertex Willow Zephyr Aurora "
    "Basalt Cobalt Granite Helix Mosaic Phoenix"
)
_FIRST_DAY = dt.date(2014, 1, 6)
_LAST_DAY = dt.date(2024, 12, 20)


def _day(rng: random.Random, start: dt.date, end: dt.date) -> str:
    return (start + dt.timedelta(days=rng.randrange((end - start).days + 1))).isoformat()


def _headcounts(rng: random.Random, total: int) -> list[int]:
    """Split ``total`` over the departments by their weights, jittered, each at least 6."""

    raw = [w * rng.uniform(0.85, 1.15) for _, _, w, *_ in _DEPARTMENTS]
    scale = total / sum(raw)
    counts = [max(6, round(r * scale)) for r in raw]
    while sum(counts) != total:  # fix rounding drift on the largest department
        i = counts.index(max(counts))
        counts[i] += 1 if sum(counts) < total else -1
    return counts


def generate(seed: int = 42) -> CompanyData:
    """The ``default`` preset: deterministic for a given ``seed`` (no clock, no global RNG)."""

    rng = random.Random(seed)
    departments: list[Department] = []
    employees: list[Employee] = []
    by_dept: dict[int, list[Employee]] = {}
    names = rng.sample([f"{f} {last}" for f in _FIRST for last in _LAST], N_EMPLOYEES)
    next_id = 1
    for dept_id, ((name, location, _w, head_title, roles, _kinds), count) in enumerate(
        zip(_DEPARTMENTS, _headcounts(rng, N_EMPLOYEES), strict=True), start=1
    ):
        pay = LOCATION_PAY[location]
        members: list[Employee] = []
        for k in range(count):
            if k == 0:  # the head: senior, hired early
                role = head_title
                base = max(b for _, b, _ in roles) * 1.25
                hired = _day(rng, _FIRST_DAY, dt.date(2018, 12, 31))
            else:
                role, base, _ = rng.choices(roles, weights=[w for *_, w in roles])[0]
                hired = _day(rng, _FIRST_DAY, _LAST_DAY)
            years = (_LAST_DAY - dt.date.fromisoformat(hired)).days / 365.25
            salary = base * pay * (1 + 0.012 * years) * rng.uniform(0.9, 1.1)
            emp = (next_id, names[next_id - 1], dept_id, role, float(round(salary / 500) * 500),
                   hired)  # fmt: skip
            members.append(emp)
            next_id += 1
        payroll = sum(e[4] for e in members)
        budget = round(payroll * rng.uniform(1.3, 1.9) / 10_000) * 10_000
        departments.append((dept_id, name, location, float(budget)))
        by_dept[dept_id] = members
        employees.extend(members)

    projects: list[Project] = []
    codenames = rng.sample(_CODENAMES, N_PROJECTS)
    weights = [len(by_dept[d[0]]) ** 0.8 for d in departments]
    for pid in range(1, N_PROJECTS + 1):
        dept_id = rng.choices([d[0] for d in departments], weights=weights)[0]
        kinds = _DEPARTMENTS[dept_id - 1][5]
        status = rng.choices(["active", "completed", "on_hold"], weights=[45, 35, 20])[0]
        members = by_dept[dept_id]
        # Mostly the department's most senior people lead; a few on-hold projects have none.
        lead: int | None
        if status == "on_hold" and rng.random() < 0.35:
            lead = None
        else:
            ranked = sorted(members, key=lambda e: -e[4])
            lead = rng.choice(ranked[: max(3, len(ranked) // 3)])[0]
        budget = float(round(rng.lognormvariate(12.3, 0.6) / 1000) * 1000)
        name = f"{codenames[pid - 1]} {rng.choice(kinds)}"
        projects.append((pid, name, dept_id, lead, status, budget))
    return CompanyData(departments, employees, projects)


def preset_data(preset: str, seed: int = 42) -> CompanyData:
    if preset == "tutorial":
        return tutorial_data()
    if preset == "default":
        return generate(seed)
    raise ValueError(f"unknown preset {preset!r}: use 'default' or 'tutorial'")


def write_database(path: Path, data: CompanyData) -> None:
    """Write ``data`` to a new SQLite file at ``path`` atomically (temp file + rename)."""

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        conn = sqlite3.connect(tmp)
        try:
            conn.execute("PRAGMA journal_mode = DELETE")
            conn.execute("PRAGMA foreign_keys = ON")
            with conn:
                conn.executescript(SCHEMA_SQL)
                conn.executemany("INSERT INTO departments VALUES (?, ?, ?, ?)", data.departments)
                conn.executemany("INSERT INTO employees VALUES (?, ?, ?, ?, ?, ?)", data.employees)
                conn.executemany("INSERT INTO projects VALUES (?, ?, ?, ?, ?, ?)", data.projects)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            problems = conn.execute("PRAGMA foreign_key_check").fetchall()
            if problems:
                raise RuntimeError(f"generated data breaks foreign keys: {problems[:3]}")
        finally:
            conn.close()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def ensure_database(path: Path, preset: str = "default", seed: int = 42) -> bool:
    """Create the database at ``path`` unless it exists; True if it was created now.

    An existing file is left untouched (whatever its preset); it must hold the three tables.
    """

    path = Path(path)
    if not path.exists():
        write_database(path, preset_data(preset, seed))
        return True
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        found = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()
    missing = [t for t in TABLES if t not in found]
    if missing:
        raise RuntimeError(f"{path} exists but lacks tables {missing}; move it away to recreate")
    return False
