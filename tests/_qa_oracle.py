"""A second, independent answer to every QA template: SQL over the raw world file.

The generator reads patients through the FHIR API and computes answers in Python over flattened
events; this oracle never touches the server or ``fhirgym.tasks.qa``'s code: it opens the world's
SQLite file read-only, pulls fields out of the stored JSON with ``json_extract``/``json_each``,
compares times as ``julianday`` numbers, and lets SQL do the ordering, grouping and aggregation.
Only a template's declared meaning (kind, operation) and a question's parameters are shared.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

J = "json_extract(json, '{}')"
LIVE = "deleted = 0 AND subj = :subj"


def _obs(category: str, other: str) -> str:
    has = ("EXISTS (SELECT 1 FROM json_each(res.json, '$.category') c, json_each(c.value, '$.coding') k "
           "WHERE json_extract(k.value, '$.code') = '{}')")
    return f"""SELECT 'Observation' AS rtype, id,
        coalesce({J.format('$.code.coding[0].display')}, {J.format('$.code.text')}) AS name,
        julianday({J.format('$.effectiveDateTime')}) AS jd, {J.format('$.valueQuantity.value')} AS value,
        {J.format('$.valueQuantity.unit')} AS unit, substr({J.format('$.encounter.reference')}, 11) AS enc,
        NULL AS end_jd, NULL AS xtype, NULL AS xid
      FROM res WHERE rtype = 'Observation' AND {LIVE}
        AND coalesce({J.format('$.status')}, '') != 'entered-in-error' AND {J.format('$.valueQuantity.value')} IS NOT NULL
        AND {has.format(category)} {'AND NOT ' + has.format(other) if other else ''}"""


def _encounters(klass: str) -> str:
    return f"""SELECT 'Encounter' AS rtype, id, coalesce({J.format('$.type[0].coding[0].display')}, '') AS name,
        julianday({J.format('$.period.start')}) AS jd,
        julianday({J.format('$.period.end')}) - julianday({J.format('$.period.start')}) AS value, 'days' AS unit,
        id AS enc, julianday({J.format('$.period.end')}) AS end_jd, NULL AS xtype, NULL AS xid
      FROM res WHERE rtype = 'Encounter' AND {LIVE} AND {J.format('$.class.code')} = '{klass}'
        AND {J.format('$.period.start')} IS NOT NULL"""


KIND_SQL = {
    "lab": _obs("laboratory", ""),
    "vital": _obs("vital-signs", "laboratory"),
    "drug": """SELECT 'MedicationRequest' AS rtype, r.id,
        coalesce(json_extract(m.json, '$.code.coding[0].display'),
                 json_extract(r.json, '$.medicationCodeableConcept.coding[0].display')) AS name,
        julianday(json_extract(r.json, '$.authoredOn')) AS jd,
        json_extract(r.json, '$.dosageInstruction[0].doseAndRate[0].doseQuantity.value') AS value,
        json_extract(r.json, '$.dosageInstruction[0].doseAndRate[0].doseQuantity.unit') AS unit,
        substr(json_extract(r.json, '$.encounter.reference'), 11) AS enc, NULL AS end_jd,
        CASE WHEN m.id IS NULL THEN NULL ELSE 'Medication' END AS xtype, m.id AS xid
      FROM res r LEFT JOIN res m ON m.rtype = 'Medication'
        AND 'Medication/' || m.id = json_extract(r.json, '$.medicationReference.reference')
      WHERE r.rtype = 'MedicationRequest' AND r.deleted = 0 AND r.subj = :subj
        AND json_extract(r.json, '$.status') != 'entered-in-error'""",
    "procedure": f"""SELECT 'Procedure' AS rtype, id, {J.format('$.code.coding[0].display')} AS name,
        julianday(coalesce({J.format('$.performedDateTime')}, {J.format('$.performedPeriod.start')})) AS jd,
        NULL AS value, NULL AS unit, substr({J.format('$.encounter.reference')}, 11) AS enc, NULL AS end_jd,
        NULL AS xtype, NULL AS xid
      FROM res WHERE rtype = 'Procedure' AND {LIVE} AND {J.format('$.status')} != 'entered-in-error'""",
    "diagnosis": f"""SELECT 'Condition' AS rtype, id, {J.format('$.code.coding[0].display')} AS name,
        julianday(coalesce({J.format('$.onsetDateTime')}, {J.format('$.recordedDate')})) AS jd,
        NULL AS value, NULL AS unit, substr({J.format('$.encounter.reference')}, 11) AS enc, NULL AS end_jd,
        NULL AS xtype, NULL AS xid
      FROM res WHERE rtype = 'Condition' AND {LIVE}
        AND coalesce({J.format('$.verificationStatus.coding[0].code')}, '') != 'entered-in-error'""",
    "specimen": f"""SELECT 'Specimen' AS rtype, id, {J.format('$.type.coding[0].display')} AS name,
        julianday({J.format('$.collection.collectedDateTime')}) AS jd, {J.format('$.collection.quantity.value')} AS value,
        {J.format('$.collection.quantity.unit')} AS unit, NULL AS enc, NULL AS end_jd, NULL AS xtype, NULL AS xid
      FROM res WHERE rtype = 'Specimen' AND {LIVE}""",
    "admission": _encounters("IMP"),
    "icu": _encounters("ACUTE"),
    "ed": _encounters("EMER"),
    "transfer": """SELECT 'Encounter' AS rtype, e.id, json_extract(l.json, '$.name') AS name,
        julianday(json_extract(s.value, '$.period.start')) AS jd, NULL AS value, NULL AS unit, e.id AS enc,
        julianday(json_extract(s.value, '$.period.end')) AS end_jd, 'Location' AS xtype, l.id AS xid
      FROM res e, json_each(e.json, '$.location') s
        JOIN res l ON l.rtype = 'Location' AND 'Location/' || l.id = json_extract(s.value, '$.location.reference')
      WHERE e.rtype = 'Encounter' AND e.deleted = 0 AND e.subj = :subj
        AND json_extract(e.json, '$.class.code') = 'IMP' AND json_extract(s.value, '$.period.start') IS NOT NULL""",
    "admit_source": f"""SELECT 'Encounter' AS rtype, id, {J.format('$.hospitalization.admitSource.coding[0].display')} AS name,
        julianday({J.format('$.period.start')}) AS jd, NULL AS value, NULL AS unit, id AS enc, NULL AS end_jd,
        NULL AS xtype, NULL AS xid
      FROM res WHERE rtype = 'Encounter' AND {LIVE} AND {J.format('$.class.code')} = 'IMP'
        AND {J.format('$.hospitalization.admitSource')} IS NOT NULL""",
    "discharge": f"""SELECT 'Encounter' AS rtype, id, 'discharge' AS name, julianday({J.format('$.period.end')}) AS jd,
        NULL AS value, NULL AS unit, id AS enc, NULL AS end_jd, NULL AS xtype, NULL AS xid
      FROM res WHERE rtype = 'Encounter' AND {LIVE} AND {J.format('$.class.code')} = 'IMP'
        AND {J.format('$.period.end')} IS NOT NULL""",
    "disposition": f"""SELECT 'Encounter' AS rtype, id,
        {J.format('$.hospitalization.dischargeDisposition.coding[0].display')} AS name,
        julianday({J.format('$.period.end')}) AS jd, NULL AS value, NULL AS unit, id AS enc, NULL AS end_jd,
        NULL AS xtype, NULL AS xid
      FROM res WHERE rtype = 'Encounter' AND {LIVE} AND {J.format('$.class.code')} = 'IMP'
        AND {J.format('$.period.end')} IS NOT NULL AND {J.format('$.hospitalization.dischargeDisposition')} IS NOT NULL""",
}
AGG_SQL = {"minimum": "MIN", "maximum": "MAX", "average": "AVG"}
PERIOD_SQL = {"daily": "%Y-%m-%d", "monthly": "%Y-%m", "yearly": "%Y"}


def _jd(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp() / 86400 + 2440587.5


class Oracle:
    """``answer(template, question)`` -> (answer, {type: sorted ids}), computed in SQL."""

    def __init__(self, path) -> None:
        self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        # one scan of the file: the rows of the types questions touch, keyed by their subject
        self.db.executescript("""
            CREATE TEMP TABLE res AS SELECT rtype, id, deleted, json,
                json_extract(json, '$.subject.reference') AS subj FROM resources
              WHERE rtype IN ('Patient', 'Observation', 'MedicationRequest', 'Medication', 'Procedure', 'Condition',
                              'Specimen', 'Encounter', 'Location');
            CREATE INDEX temp.res_subj ON res (subj, rtype);
            CREATE INDEX temp.res_id ON res (rtype, id);""")

    def q(self, sql: str, args: dict) -> list[tuple]:
        return self.db.execute(sql, args).fetchall()

    def _visit(self, which: str, args: dict) -> str | None:
        """The first/last finished admission, or the one in progress at the anchor."""
        adm = f"({_encounters('IMP')})"
        if which == "current_visit":
            rows = self.q(f"SELECT id FROM {adm} WHERE jd <= :now AND (end_jd IS NULL OR end_jd > :now) "
                          "ORDER BY jd DESC, id DESC LIMIT 1", args)
        else:
            order = "ASC" if which == "first_visit" else "DESC"
            rows = self.q(f"SELECT id FROM {adm} WHERE end_jd <= :now AND jd <= :now ORDER BY jd {order}, id {order} "
                          "LIMIT 1", args)
        return rows[0][0] if rows else None

    def events_sql(self, kind: str, params: dict, args: dict) -> str:
        """The kind's rows for the patient, filtered by name(s), window and threshold (all in SQL)."""
        where = ["jd IS NOT NULL", "jd <= :now"]
        names = params.get("names") or ([params["name"]] if "name" in params else [])
        for n, name in enumerate(names):
            args[f"n{n}"] = name.strip().lower()
        if names:
            where.append("lower(trim(name)) IN (" + ", ".join(f":n{n}" for n in range(len(names))) + ")")
        kind_w, _, arg = params.get("window", "all").partition(":")
        if kind_w == "since":
            args["since"] = _jd(arg + " 00:00:00")
            where.append("jd >= :since")
        elif kind_w == "year":
            where.append(f"strftime('%Y', jd) = '{arg}'")
        elif kind_w == "month":
            where.append(f"strftime('%Y-%m', jd) = '{arg}'")
        elif kind_w in ("this_year", "last_year"):
            where.append(f"CAST(strftime('%Y', jd) AS INTEGER) = CAST(strftime('%Y', :now) AS INTEGER)"
                         f" - {int(kind_w == 'last_year')}")
        elif kind_w.endswith("_visit"):
            args["visit"] = self._visit(kind_w, args)
            where.append("enc IN (SELECT id FROM res WHERE rtype = 'Encounter' AND (id = :visit "
                         "OR json_extract(json, '$.partOf.reference') = 'Encounter/' || :visit))")
        if "threshold" in params:
            args["thr"] = params["threshold"]
            where.append("value " + (">" if params["cmp"] == "greater" else "<") + " :thr")
        return f"SELECT * FROM ({KIND_SQL[kind]}) WHERE " + " AND ".join(where)

    def answer(self, kind: str, op: str, question) -> tuple[object, dict[str, list[str]]]:
        params = question.params
        args: dict = {"subj": f"Patient/{question.patient_id}", "now": _jd(question.anchor)}
        if op in ("gender", "marital"):
            path = "$.gender" if op == "gender" else "$.maritalStatus.coding[0].display"
            value = self.q(f"SELECT json_extract(json, '{path}') FROM res WHERE rtype = 'Patient' AND id = :pid",
                           {"pid": question.patient_id})[0][0]
            return ([value], {"Patient": [question.patient_id]}) if value else (None, {})
        if op == "elapsed_stay":
            visit = self._visit("current_visit", args)
            args["visit"] = visit
            rows = self.q(f"""SELECT id, (:now - jd) FROM ({KIND_SQL[kind]}) WHERE jd <= :now
                    AND (end_jd IS NULL OR end_jd > :now) AND id IN (SELECT id FROM res WHERE rtype = 'Encounter'
                    AND (id = :visit OR json_extract(json, '$.partOf.reference') = 'Encounter/' || :visit))
                    ORDER BY jd DESC, id DESC LIMIT 1""", args)
            if not rows or visit is None:
                return None, {}
            return rows[0][1] * (24 if params["unit"] == "hours" else 1), {"Encounter": [rows[0][0]]}
        if op == "stay_length":
            order = "ASC" if params["which"] == "first" else "DESC"
            rows = self.q(f"SELECT id, value FROM ({KIND_SQL[kind]}) WHERE end_jd <= :now ORDER BY jd {order}, id {order} "
                          "LIMIT 1", args)
            return (rows[0][1], {"Encounter": [rows[0][0]]}) if rows else (None, {})
        ev = self.events_sql(kind, params, args)
        if op in ("sum", "aggregate", "grouped"):
            ev = f"SELECT * FROM ({ev}) WHERE value IS NOT NULL" + (" AND end_jd <= :now" if kind == "icu" else "")
        rows = self.q(f"SELECT rtype, id, xtype, xid FROM ({ev})", args)
        every = _ids(rows)
        if op == "exists":
            return bool(rows), every
        if op == "count":
            return len(rows), every
        if op == "times":
            times = [r[0] for r in self.q(f"SELECT strftime('%Y-%m-%d %H:%M:%S', jd) FROM ({ev}) ORDER BY jd", args)]
            return times or None, every
        if not rows:
            return None, {}
        if op == "sum":
            return self.q(f"SELECT SUM(value) FROM ({ev})", args)[0][0], every
        if op == "aggregate":
            return self.q(f"SELECT {AGG_SQL[params['agg']]}(value) FROM ({ev})", args)[0][0], every
        if op == "grouped":
            fmt = PERIOD_SQL[params["period"]]
            return [r[1] for r in self.q(f"SELECT strftime('{fmt}', jd) AS p, {AGG_SQL[params['agg']]}(value) "
                                         f"FROM ({ev}) GROUP BY p ORDER BY p", args)], every
        if op in ("difference", "compare"):
            times = [r[0] for r in self.q(f"SELECT DISTINCT jd FROM ({ev}) ORDER BY jd", args)]
            if len(times) < 2:
                return None, {}
            picked = [times[0] if params["pair"] == "first" else times[-2], times[-1]]
            values = []
            for t in picked:
                args["t"] = t
                values.append(self.q(f"SELECT DISTINCT value FROM ({ev}) WHERE jd = :t", args))
            args["t0"], args["t1"] = picked
            ids = _ids(self.q(f"SELECT rtype, id, xtype, xid FROM ({ev}) WHERE jd IN (:t0, :t1)", args))
            assert all(len(v) == 1 for v in values), values
            earlier, last = values[0][0][0], values[1][0][0]
            if op == "difference":
                return last - earlier, ids
            return (last > earlier) if params["cmp"] == "greater" else (last < earlier), ids
        # first/last by time (ties included): of all rows, or of the rows at the extreme value
        pool = ev
        if op == "extreme_time":
            pool = f"SELECT * FROM ({ev}) WHERE value = (SELECT {'MAX' if params['sort'] == 'highest' else 'MIN'}(value) FROM ({ev}))"
        order = "ASC" if params["which"] == "first" else "DESC"
        args["t"] = self.q(f"SELECT jd FROM ({pool}) ORDER BY jd {order} LIMIT 1", args)[0][0]
        at = f"SELECT * FROM ({pool}) WHERE jd = :t"
        ids = _ids(self.q(f"SELECT rtype, id, xtype, xid FROM ({at})", args))
        if op in ("time", "extreme_time"):
            return self.q("SELECT strftime('%Y-%m-%d %H:%M:%S', :t)", args)[0][0], ids
        if op == "name":
            return sorted(r[0] for r in self.q(f"SELECT DISTINCT name FROM ({at})", args)), ids
        if op == "value":
            values = self.q(f"SELECT DISTINCT value FROM ({at})", args)
            assert len(values) == 1, values
            return values[0][0], ids
        if op == "elapsed":
            return (args["now"] - args["t"]) * (24 if params["unit"] == "hours" else 1), ids
        raise ValueError(op)


def _ids(rows: list[tuple]) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {}
    for rtype, rid, xtype, xid in rows:
        out.setdefault(rtype, set()).add(rid)
        if xtype:
            out.setdefault(xtype, set()).add(xid)
    return {k: sorted(v) for k, v in sorted(out.items())}
