"""Question templates of the ``sql`` strategy for the company schema.

Each template is a question in a few phrasings, the SQL that answers it (run through the
server's own ``run_query``), a difficulty and an answer kind. Placeholders are filled from
pools sampled from the real data (see ``sql.py``): ``{department}``, ``{location}``,
``{role}``, ``{year}``, ``{year_from}``/``{year_to}``, ``{status}``, ``{threshold}``, ``{k}``.
In SQL, ``{x!q}`` is the value as a quoted SQL literal and ``{k1}`` is k + 1 (to see ties).

Every phrasing says what form the answer takes, so the answer can be checked.
"""

from __future__ import annotations

from mcprl_scenario_gen.strategies.sql_common import SqlTemplate

NUMBER = " Answer with the number only."
ROUND2 = " Round to two decimals and answer with the number only."


EMP = ("id", "name", "department_id", "role", "salary", "hire_date")
DEPT = ("id", "name", "location", "budget")
PROJ = ("id", "name", "department_id", "lead_id", "status", "budget")
_D = {"departments": DEPT}
_E = {"employees": EMP}
_P = {"projects": PROJ}
_DE = {**_D, **_E}
_DP = {**_D, **_P}
_DEP = {**_D, **_E, **_P}
_EP = {**_E, **_P}

COMPANY_TEMPLATES: tuple[SqlTemplate, ...] = (
    # -- difficulty 1: one table, one condition -------------------------------------------
    SqlTemplate(
        "count_employees", 1, "number",
        ("How many employees does the company have in total?" + NUMBER,
         "What is the total number of employees?" + NUMBER),
        "SELECT COUNT(*) FROM employees", requires=_E),
    SqlTemplate(
        "department_location", 1, "text",
        ("In which city is the {department} department located? Answer with the city name only.",
         "Where is the {department} department based? Answer with the location only."),
        "SELECT location FROM departments WHERE name = {department!q}",
        ("department",), _D),
    SqlTemplate(
        "count_role", 1, "number",
        ("How many employees have the role {role}?" + NUMBER,
         "How many people work as {role}?" + NUMBER),
        "SELECT COUNT(*) FROM employees WHERE role = {role!q}", ("role",), _E),
    SqlTemplate(
        "count_projects_status", 1, "number",
        ("How many projects have the status {status}?" + NUMBER,
         "How many projects are {status}?" + NUMBER),
        "SELECT COUNT(*) FROM projects WHERE status = {status!q}", ("status",), _P),
    SqlTemplate(
        "department_budget", 1, "number",
        ("What is the budget of the {department} department?" + NUMBER,
         "How large is the {department} department's budget?" + NUMBER),
        "SELECT budget FROM departments WHERE name = {department!q}", ("department",), _D),
    # -- difficulty 2: a filter, an aggregate, or a two-table join --------------------------
    SqlTemplate(
        "count_department_employees", 2, "number",
        ("How many employees work in the {department} department?" + NUMBER,
         "What is the headcount of the {department} department?" + NUMBER),
        "SELECT COUNT(*) FROM employees e JOIN departments d ON e.department_id = d.id "
        "WHERE d.name = {department!q}", ("department",), _DE),
    SqlTemplate(
        "departments_in_location", 2, "set",
        ("Which departments are located in {location}? List the department names, "
         "separated by commas.",
         "Name every department based in {location}. List the department names, "
         "separated by commas."),
        "SELECT name FROM departments WHERE location = {location!q} ORDER BY name",
        ("location",), _D),
    SqlTemplate(
        "employees_hired_in_year", 2, "set",
        ("Which employees were hired in {year}? List their names, separated by commas.",
         "Who joined the company during {year}? List the employees' names, "
         "separated by commas."),
        "SELECT name FROM employees WHERE hire_date >= '{year}-01-01' "
        "AND hire_date <= '{year}-12-31' ORDER BY name", ("year",), _E),
    SqlTemplate(
        "max_salary_role", 2, "number",
        ("What is the highest salary among employees with the role {role}?" + NUMBER,
         "What does the best-paid {role} earn?" + NUMBER),
        "SELECT MAX(salary) FROM employees WHERE role = {role!q}", ("role",), _E),
    SqlTemplate(
        "count_salary_above", 2, "number",
        ("How many employees earn a salary above {threshold}?" + NUMBER,
         "How many employees are paid more than {threshold}?" + NUMBER),
        "SELECT COUNT(*) FROM employees WHERE salary > {threshold}", ("threshold",), _E),
    SqlTemplate(
        "department_projects", 2, "set",
        ("Which projects belong to the {department} department? List the project names, "
         "separated by commas.",
         "List all projects run by the {department} department, separated by commas."),
        "SELECT p.name FROM projects p JOIN departments d ON p.department_id = d.id "
        "WHERE d.name = {department!q} ORDER BY p.name", ("department",), _DP),
    # -- difficulty 3: aggregates over joins, rankings, date ranges -------------------------
    SqlTemplate(
        "avg_salary_department", 3, "number",
        ("What is the average salary of employees in the {department} department?" + ROUND2,
         "On average, how much do {department} employees earn?" + ROUND2),
        "SELECT AVG(e.salary) FROM employees e JOIN departments d ON e.department_id = d.id "
        "WHERE d.name = {department!q}", ("department",), _DE, round_to=2),
    SqlTemplate(
        "total_salary_location", 3, "number",
        ("What is the total salary of all employees who work in departments located in "
         "{location}?" + NUMBER,
         "Add up the salaries of everyone working for a department based in {location}. "
         "What is the total?" + NUMBER),
        "SELECT SUM(e.salary) FROM employees e JOIN departments d ON e.department_id = d.id "
        "WHERE d.location = {location!q}", ("location",), _DE),
    SqlTemplate(
        "top_k_salaries", 3, "list",
        ("Who are the {k} highest-paid employees? List their names from highest to lowest "
         "salary, separated by commas.",
         "Name the top {k} earners in the company, from highest to lowest salary, "
         "separated by commas."),
        "SELECT name, salary FROM employees ORDER BY salary DESC LIMIT {k1}", ("k",), _E,
        ties=True),
    SqlTemplate(
        "count_hired_between", 3, "number",
        ("How many employees were hired between {year_from}-01-01 and {year_to}-12-31 "
         "(inclusive)?" + NUMBER,
         "How many people joined the company from the start of {year_from} to the end of "
         "{year_to}?" + NUMBER),
        "SELECT COUNT(*) FROM employees WHERE hire_date >= '{year_from}-01-01' "
        "AND hire_date <= '{year_to}-12-31'", ("year_range",), _E),
    SqlTemplate(
        "department_most_employees", 3, "text",
        ("Which department has the most employees? Answer with the department name only.",
         "Which department is the largest by headcount? Answer with the department name "
         "only."),
        "SELECT d.name, COUNT(e.id) AS n FROM departments d LEFT JOIN employees e "
        "ON e.department_id = d.id GROUP BY d.id, d.name ORDER BY n DESC LIMIT 2",
        requires=_DE, ties=True),
    SqlTemplate(
        "department_hired_since", 3, "number",
        ("How many employees in the {department} department were hired in {year} or later?"
         + NUMBER,
         "Since the start of {year}, how many people has the {department} department hired "
         "who still work there?" + NUMBER),
        "SELECT COUNT(*) FROM employees e JOIN departments d ON e.department_id = d.id "
        "WHERE d.name = {department!q} AND e.hire_date >= '{year}-01-01'",
        ("department", "year"), _DE),
    # -- difficulty 4: three tables, grouped rankings, subqueries ---------------------------
    SqlTemplate(
        "project_leads_department", 4, "set",
        ("Who leads the projects of the {department} department? List the names of the "
         "project leads, separated by commas.",
         "Which employees are project leads on {department} department projects? List their "
         "names, separated by commas."),
        "SELECT DISTINCT e.name FROM projects p JOIN departments d ON p.department_id = d.id "
        "JOIN employees e ON p.lead_id = e.id WHERE d.name = {department!q} ORDER BY e.name",
        ("department",), _DEP),
    SqlTemplate(
        "project_budget_status_location", 4, "number",
        ("What is the total budget of {status} projects run by departments located in "
         "{location}?" + NUMBER,
         "Sum the budgets of all {status} projects belonging to departments based in "
         "{location}. What is the total?" + NUMBER),
        "SELECT SUM(p.budget) FROM projects p JOIN departments d ON p.department_id = d.id "
        "WHERE p.status = {status!q} AND d.location = {location!q}",
        ("status", "location"), _DP),
    SqlTemplate(
        "top_k_departments_avg_salary", 4, "list",
        ("Which {k} departments have the highest average salary? List the department names "
         "from highest to lowest average salary, separated by commas.",
         "Rank the departments by average employee salary and give the top {k}, highest "
         "first, separated by commas."),
        "SELECT d.name, AVG(e.salary) AS avg_salary FROM departments d JOIN employees e "
        "ON e.department_id = d.id GROUP BY d.id, d.name ORDER BY avg_salary DESC "
        "LIMIT {k1}", ("k",), _DE, ties=True),
    SqlTemplate(
        "above_department_average", 4, "set",
        ("Which employees of the {department} department earn more than that department's "
         "average salary? List their names, separated by commas.",
         "In the {department} department, who is paid above the department average? List "
         "their names, separated by commas."),
        "SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id "
        "WHERE d.name = {department!q} AND e.salary > (SELECT AVG(e2.salary) FROM employees "
        "e2 WHERE e2.department_id = d.id) ORDER BY e.name", ("department",), _DE),
    SqlTemplate(
        "budget_left_after_salaries", 4, "number",
        ("What is the {department} department's budget minus the total salaries of its "
         "employees?" + NUMBER,
         "If the {department} department paid all its employees' salaries out of its budget, "
         "how much would be left? (It may be negative.)" + NUMBER),
        "SELECT d.budget - COALESCE((SELECT SUM(e.salary) FROM employees e "
        "WHERE e.department_id = d.id), 0) FROM departments d WHERE d.name = {department!q}",
        ("department",), _DE),
    SqlTemplate(
        "top_paid_lead_status", 4, "text",
        ("Among the employees who lead at least one {status} project, who has the highest "
         "salary? Answer with the name only.",
         "Of all leads of {status} projects, who earns the most? Answer with the name only."),
        "SELECT e.name, e.salary FROM employees e WHERE e.id IN (SELECT lead_id FROM "
        "projects WHERE status = {status!q}) ORDER BY e.salary DESC LIMIT 2",
        ("status",), _EP, ties=True),
    # -- difficulty 5: several joins and conditions combined --------------------------------
    SqlTemplate(
        "lead_salary_status_location", 5, "number",
        ("What is the combined salary of the employees who lead {status} projects belonging "
         "to departments located in {location}? Count each lead once." + NUMBER,
         "Take every {status} project of a department based in {location}, find its lead, "
         "and add up those leads' salaries (each person once). What is the total?" + NUMBER),
        "SELECT SUM(salary) FROM employees WHERE id IN (SELECT p.lead_id FROM projects p "
        "JOIN departments d ON p.department_id = d.id WHERE p.status = {status!q} "
        "AND d.location = {location!q})", ("status", "location"), _DEP),
    SqlTemplate(
        "location_top_project_budget", 5, "text",
        ("Which department located in {location} has the largest total budget across its "
         "{status} projects? Answer with the department name only.",
         "Among departments based in {location}, whose {status} projects add up to the "
         "biggest budget? Answer with the department name only."),
        "SELECT d.name, SUM(p.budget) AS total FROM departments d JOIN projects p "
        "ON p.department_id = d.id WHERE d.location = {location!q} AND p.status = {status!q} "
        "GROUP BY d.id, d.name ORDER BY total DESC LIMIT 2",
        ("location", "status"), _DP, ties=True),
    SqlTemplate(
        "location_hires_in_year", 5, "set",
        ("Which employees working in departments located in {location} were hired in {year} "
         "and lead at least one project? List their names, separated by commas.",
         "List the project leads from {location}-based departments who joined in {year}, "
         "separated by commas."),
        "SELECT DISTINCT e.name FROM employees e JOIN departments d ON e.department_id = d.id "
        "JOIN projects p ON p.lead_id = e.id WHERE d.location = {location!q} "
        "AND e.hire_date >= '{year}-01-01' AND e.hire_date <= '{year}-12-31' ORDER BY e.name",
        ("location", "year"), _DEP),
    SqlTemplate(
        "leads_outside_department", 5, "set",
        ("Which employees lead a project that belongs to a department other than their own? "
         "List their names, separated by commas.",
         "Find the project leads whose project is run by a different department than the one "
         "they work in. List their names, separated by commas."),
        "SELECT DISTINCT e.name FROM projects p JOIN employees e ON p.lead_id = e.id "
        "JOIN departments d ON p.department_id = d.id "
        "WHERE e.department_id <> p.department_id ORDER BY e.name", (), _DEP),
)
