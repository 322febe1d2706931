"""Genetic testing work-ups and surgery plans: what the FHIR-AgentEval "surgery & test orders" tasks need.

For about a quarter of the living patients one clinical indication (HBOC, Lynch syndrome, familial
hypercholesterolemia, CF carrier screening) drives a coherent work-up: family history, consent, the order,
a specimen and a genetic report with HL7 Genomics Reporting style variant observations (ClinVar's
classifications for the well-known variants). Orders come in three states and every reported patient
gets a nearby chest X-ray report, so tasks have both kinds of answers and a distractor; surgery plans fall
within, beyond and before a 14-day window for the same reason. The codes and shapes: docs/WORLD.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from random import Random

from ..spec.codes import (
    ACT_CODE,
    ADMINISTRATIVE_GENDER,
    CONSENT_ACTION,
    CONSENT_POLICY,
    CONSENT_SCOPE,
    DIAGNOSTIC_SERVICE,
    HGNC,
    HGVS,
    ICD10CM,
    LOINC,
    OBSERVATION_CATEGORY,
    ORGANIZATION_TYPE,
    PARTICIPATION_TYPE,
    ROLE_CODE,
    SNOMED,
    UCUM,
)
from ._clinical import (
    Directory,
    PatientIndex,
    age_on,
    alive_on,
    at,
    concept,
    iso,
    ref,
    ref_id,
)
from ._context import WorldContext

#: Name of the genetic-testing lab, as the admin generator names it (found by "genomic" in the name).
LAB_NAME = "Bay State Genomics Laboratory"
GENETIC_SHARE = 0.25
SURGERY_SHARE = 0.12

GENE_IDS = {"BRCA1": "HGNC:1100", "BRCA2": "HGNC:1101", "PALB2": "HGNC:26144", "MLH1": "HGNC:7127",
            "MSH2": "HGNC:7325", "MSH6": "HGNC:7329", "PMS2": "HGNC:9122", "LDLR": "HGNC:6547",
            "APOB": "HGNC:603", "PCSK9": "HGNC:20001", "CFTR": "HGNC:1884"}

#: LOINC answer codes of the Genomics Reporting IG
PRESENT, ABSENT = ("LA9633-4", "Present"), ("LA9634-2", "Absent")
SIGNIFICANCE = {"P": ("LA6668-3", "Pathogenic"), "LP": ("LA26332-9", "Likely pathogenic"),
                "VUS": ("LA26333-7", "Uncertain significance"), "B": ("LA6675-8", "Benign")}
HETEROZYGOUS = ("LA6706-1", "Heterozygous")
GERMLINE = ("LA6683-2", "Germline")


@dataclass(frozen=True)
class Variant:
    gene: str
    c_hgvs: str
    p_hgvs: str | None
    g_hgvs: str | None  # GRCh38, only where the genomic change is certain
    significance: str  # key of SIGNIFICANCE


VARIANTS = [
    Variant("BRCA1", "NM_007294.4:c.68_69del", "NP_009225.1:p.Glu23ValfsTer17", "NC_000017.11:g.43124027_43124028del", "P"),
    Variant("BRCA1", "NM_007294.4:c.5266dup", "NP_009225.1:p.Gln1756ProfsTer74", None, "P"),
    Variant("BRCA2", "NM_000059.4:c.5946del", "NP_000050.3:p.Ser1982ArgfsTer22", None, "P"),
    Variant("BRCA1", "NM_007294.4:c.2612C>T", "NP_009225.1:p.Pro871Leu", None, "B"),
    Variant("BRCA2", "NM_000059.4:c.7397T>C", "NP_000050.3:p.Val2466Ala", None, "B"),
    Variant("PALB2", "NM_024675.4:c.2993G>A", "NP_078951.2:p.Gly998Glu", None, "VUS"),
    Variant("MLH1", "NM_000249.4:c.350C>T", "NP_000240.1:p.Thr117Met", None, "LP"),
    Variant("MSH2", "NM_000251.3:c.942+3A>T", None, None, "P"),
    Variant("MSH6", "NM_000179.3:c.1508C>G", "NP_000170.1:p.Ser503Cys", None, "VUS"),
    Variant("LDLR", "NM_000527.5:c.1775G>A", "NP_000518.1:p.Gly592Glu", None, "P"),
    Variant("APOB", "NM_000384.3:c.10580G>A", "NP_000375.3:p.Arg3527Gln", None, "P"),
    Variant("PCSK9", "NM_174936.4:c.1120G>T", "NP_777596.2:p.Asp374Tyr", None, "P"),
    Variant("CFTR", "NM_000492.4:c.1521_1523del", "NP_000483.3:p.Phe508del", None, "P"),
    Variant("CFTR", "NM_000492.4:c.1652G>A", "NP_000483.3:p.Gly551Asp", None, "P"),
]


@dataclass(frozen=True)
class Indication:
    name: str  # what is tested for, as the panel and the report name it
    genes: tuple[str, ...]
    reason: tuple[str, str]  # ICD-10-CM
    #: (relationship code, display, sex, condition SNOMED code, display, onset age range)
    relatives: tuple[tuple[str, str, str, str, str, tuple[int, int]], ...]
    meaning: str  # what a pathogenic finding means, for the report's conclusion

    def order_text(self, kind: str) -> str:
        genes = ", ".join(self.genes)
        if kind == "panel":
            return f"{self.name} gene panel ({genes})"
        return f"Whole {kind} sequencing, {self.name.lower()} analysis ({genes})"


BREAST = ("254837009", "Malignant neoplasm of breast (disorder)")
OVARY = ("363443007", "Malignant tumor of ovary (disorder)")
COLON = ("363406005", "Malignant tumor of colon (disorder)")
MI = ("22298006", "Myocardial infarction (disorder)")
FH = ("398036000", "Familial hypercholesterolemia (disorder)")
CF = ("190905008", "Cystic fibrosis (disorder)")

INDICATIONS = [
    Indication("Hereditary breast and ovarian cancer", ("BRCA1", "BRCA2", "PALB2"),
               ("Z80.3", "Family history of malignant neoplasm of breast"),
               (("MTH", "mother", "female", *BREAST, (38, 55)), ("MAUNT", "maternal aunt", "female", *OVARY, (45, 65)),
                ("SIS", "sister", "female", *BREAST, (32, 48)), ("MGRMTH", "maternal grandmother", "female", *BREAST, (50, 70))),
               "an increased hereditary risk of breast and ovarian cancer"),
    Indication("Lynch syndrome", ("MLH1", "MSH2", "MSH6", "PMS2"),
               ("Z80.0", "Family history of malignant neoplasm of digestive organs"),
               (("FTH", "father", "male", *COLON, (42, 58)), ("BRO", "brother", "male", *COLON, (38, 52)),
                ("PGRFTH", "paternal grandfather", "male", *COLON, (55, 72))),
               "a diagnosis of Lynch syndrome"),
    Indication("Familial hypercholesterolemia", ("LDLR", "APOB", "PCSK9"),
               ("Z83.42", "Family history of familial hypercholesterolemia"),
               (("FTH", "father", "male", *MI, (41, 55)), ("SIS", "sister", "female", *FH, (18, 35)),
                ("MTH", "mother", "female", *FH, (30, 50))),
               "a diagnosis of familial hypercholesterolemia"),
    Indication("Cystic fibrosis carrier screening", ("CFTR",),
               ("Z84.81", "Family history of carrier of genetic disease"),
               (("BRO", "brother", "male", *CF, (0, 2)), ("SIS", "sister", "female", *CF, (0, 2))),
               "carrier status for cystic fibrosis"),
]

#: test kind -> (LOINC code, display) of the order
TESTS = {
    "genome": ("86206-0", "Whole genome sequence analysis in Blood or Tissue by Molecular genetics method"),
    "exome": ("86205-2", "Whole exome sequence analysis in Blood or Tissue by Molecular genetics method"),
    "panel": ("81247-9", "Master HL7 genetic variant reporting panel"),
}
SPECIMENS = [("119297000", "Blood specimen"), ("119342007", "Saliva specimen")]
CXR = ("36643-5", "XR Chest 2 Views")
CXR_FINDINGS = ["No acute cardiopulmonary process.", "Lungs are clear. Heart size is normal.",
                "Mild bibasilar atelectasis. No focal consolidation or effusion.",
                "Stable mild cardiomegaly. No pulmonary edema.", "No pneumothorax or pleural effusion."]

#: surgical procedures (SNOMED CT), reason, surgeon specialty words; appendectomy is the common case
SURGERIES = [
    ("80146002", "Appendectomy", ("85189001", "Acute appendicitis (disorder)"), ("Surg",)),
    ("45595009", "Laparoscopic cholecystectomy", None, ("Surg",)),
    ("44558001", "Repair of inguinal hernia", None, ("Surg",)),
    ("609588000", "Total knee replacement", None, ("Orthop",)),
    ("52734007", "Total hip replacement", None, ("Orthop",)),
]
SURGERY_REASON_TEXT = {"45595009": "Symptomatic cholelithiasis", "44558001": "Inguinal hernia",
                       "609588000": "Osteoarthritis of knee", "52734007": "Osteoarthritis of hip"}


def generate(ctx: WorldContext) -> list[dict]:
    """Genetic work-ups (orders, specimens, reports, consents, family history), imaging distractors and
    surgery plans, for living patients with an active record."""
    directory = Directory.of(ctx)
    index = PatientIndex.of(ctx, ("Encounter",))
    return _genetics(ctx, directory, index) + _surgery_plans(ctx, directory)


def _living(ctx: WorldContext, min_age: int) -> list[dict]:
    return [p for p in ctx.patients() if p.get("active", True) and alive_on(p, ctx.anchor)
            and age_on(p, ctx.anchor) >= min_age]


# ------------------------------------------------------------------------------------------------
# genetic work-ups
# ------------------------------------------------------------------------------------------------
def _genetics(ctx: WorldContext, directory: Directory, index: PatientIndex) -> list[dict]:
    rng = ctx.rng("genetics")
    eligible = _living(ctx, 18) or _living(ctx, 0)
    count = min(len(eligible), max(6, round(GENETIC_SHARE * len(ctx.patients()))))
    if not count:
        return []
    chosen = sorted(rng.sample(eligible, count), key=eligible.index)
    # the first six cover every state, four of them with a report (so that even the smallest world has
    # enough reported orders to vary the tasks' gold over seeds); the rest are drawn
    states = ["final", "preliminary", "pending", "final", "preliminary", "final"][:count]
    rng.shuffle(states)
    states += rng.choices(["final", "preliminary", "pending"], weights=[5, 2, 3], k=max(0, count - 6))
    work = _Workup(ctx, rng, directory, index)
    out: list[dict] = [work.lab] if work.new_lab else []
    for patient, state in zip(chosen, states):
        out += work.patient(patient, state)
    return out


class _Workup:
    def __init__(self, ctx: WorldContext, rng: Random, directory: Directory, index: PatientIndex) -> None:
        self.ctx, self.rng, self.dir, self.index = ctx, rng, directory, index
        # the admin generator's genetic-testing lab when it ran first, else one of our own (same name)
        existing = [o for o in directory.orgs if "genomic" in o.get("name", "").lower()]
        self.lab = existing[0] if existing else {
            "resourceType": "Organization", "id": self.new_id(), "active": True,
            "type": [concept(ORGANIZATION_TYPE, "prov", "Healthcare Provider")],
            "name": LAB_NAME,
            "telecom": [{"system": "phone", "value": "617-555-0133"}],
            "address": [{"line": ["320 Bent Street"], "city": "Cambridge", "state": "MA",
                         "postalCode": "02142", "country": "US"}],
        }
        self.new_lab = not existing
        self.recent = False  # whether a pending order placed within the last two weeks exists yet
        geneticists = directory.practitioners_where(("genetic",))
        self.requesters = geneticists or list(directory.practitioners.values())

    def new_id(self) -> str:
        return self.ctx.new_id("genetics")

    def patient(self, patient: dict, state: str) -> list[dict]:
        rng, anchor = self.rng, self.ctx.anchor
        indication = rng.choice(INDICATIONS)
        kind = rng.choices(["panel", "exome", "genome"], weights=[3, 1, 1])[0]
        subject = {"reference": f"Patient/{patient['id']}"}
        requester = rng.choice(self.requesters) if self.requesters else None
        # when things happened (days before the anchor)
        if state == "final":
            ordered = at(self.ctx.day(-rng.randint(60, 700)), rng.randint(13, 20), rng.randint(0, 59))
        elif state == "preliminary":
            ordered = at(self.ctx.day(-rng.randint(25, 80)), rng.randint(13, 20), rng.randint(0, 59))
        else:  # the first pending order is recent: "orders placed in the last 14 days" has an answer
            ordered = at(self.ctx.day(-rng.randint(1, 40 if self.recent else 13)), rng.randint(13, 20), rng.randint(0, 59))
            self.recent = True
        collected = ordered + timedelta(days=rng.randint(0, 6), hours=rng.randint(0, 3))
        collected_yet = state != "pending" or (collected < at(anchor, 0) - timedelta(days=2) and rng.random() < 0.7)

        out: list[dict] = []
        relatives = self._family_history(patient, indication, ordered - timedelta(days=rng.randint(1, 30)))
        out += relatives
        test_code, test_display = TESTS[kind]
        order_text = indication.order_text(kind)
        out += self._consents(patient, requester, ordered - timedelta(minutes=rng.randint(20, 90)),
                              (test_code, test_display, order_text))

        order: dict = {
            "resourceType": "ServiceRequest", "id": self.new_id(),
            "status": "completed" if state == "final" else "active", "intent": "order",
            "category": [concept(SNOMED, "108252007", "Laboratory procedure"), concept(DIAGNOSTIC_SERVICE, "GE", "Genetics")],
            "priority": "routine",
            "code": concept(LOINC, test_code, test_display, text=order_text),
            "subject": subject, "authoredOn": iso(ordered),
            "performer": [ref(self.lab)],
            "reasonCode": [concept(ICD10CM, *indication.reason)],
        }
        if requester:
            order["requester"] = ref(requester)
        if state == "final":
            order["supportingInfo"] = [ref(r) for r in relatives]
        out.append(order)
        if not collected_yet:
            return out + self._distractors(patient, ordered, rate=0.5)

        specimen_code, specimen_display = rng.choice(SPECIMENS)
        specimen = {
            "resourceType": "Specimen", "id": self.new_id(), "status": "available",
            "accessionIdentifier": {"system": "https://genomics.baystate.example/accession",
                                    "value": f"GX{rng.randint(10_000_000, 99_999_999)}"},
            "type": concept(SNOMED, specimen_code, specimen_display),
            "subject": subject, "receivedTime": iso(collected + timedelta(hours=rng.randint(18, 48))),
            "request": [ref(order)],
            "collection": {"collectedDateTime": iso(collected)},
        }
        if specimen_code == "119297000":
            specimen["collection"]["quantity"] = {"value": rng.choice((4, 6)), "unit": "mL", "system": UCUM,
                                                  "code": "mL"}
        order["specimen"] = [ref(specimen)]
        out.append(specimen)
        if state == "pending":
            return out + self._distractors(patient, ordered, rate=0.5)

        issued = (collected + timedelta(days=rng.randint(14, 40)) if state == "final"
                  else at(self.ctx.day(-rng.randint(1, 10)), rng.randint(9, 17), rng.randint(0, 59)))
        issued = max(issued, collected + timedelta(days=3))
        results = self._results(subject, specimen, indication, collected, issued, state)
        report = {
            "resourceType": "DiagnosticReport", "id": self.new_id(), "basedOn": [ref(order)],
            "status": state, "category": [concept(DIAGNOSTIC_SERVICE, "GE", "Genetics")],
            "code": concept(LOINC, "51969-4", "Genetic analysis report"),
            "subject": subject, "effectiveDateTime": iso(collected), "issued": iso(issued),
            "performer": [ref(self.lab)], "specimen": [ref(specimen)],
            "result": [ref(o) for o in results],
            "conclusion": self._conclusion(results, indication, state),
        }
        if state == "final":
            positive = any(_significance(o) in ("P", "LP") for o in results)
            report["conclusionCode"] = [concept(SNOMED, *(("10828004", "Positive") if positive
                                                           else ("260385009", "Negative")))]
        out += [*results, report]
        return out + self._distractors(patient, ordered, rate=1.0)

    # -- pieces --------------------------------------------------------------------------------
    def _family_history(self, patient: dict, indication: Indication, when: datetime) -> list[dict]:
        rng = self.rng
        picks = rng.sample(indication.relatives, min(len(indication.relatives), rng.choice((1, 1, 2))))
        out = []
        for rel_code, rel_display, sex, cond_code, cond_display, (lo, hi) in picks:
            out.append({
                "resourceType": "FamilyMemberHistory", "id": self.new_id(), "status": "completed",
                "patient": {"reference": f"Patient/{patient['id']}"}, "date": iso(when),
                "relationship": concept(ROLE_CODE, rel_code, rel_display),
                "sex": concept(ADMINISTRATIVE_GENDER, sex, sex.capitalize()),
                "condition": [{"code": concept(SNOMED, cond_code, cond_display), "onsetAge": _onset_age(rng, lo, hi)}],
            })
        return out

    def _consents(self, patient: dict, requester: dict | None, when: datetime,
                  test: tuple[str, str, str]) -> list[dict]:
        rng = self.rng
        patient_ref = {"reference": f"Patient/{patient['id']}"}
        start = when.date().isoformat()
        treatment = {
            "resourceType": "Consent", "id": self.new_id(), "status": "active",
            "scope": concept(CONSENT_SCOPE, "treatment", "Treatment"),
            "category": [concept(LOINC, "59284-0", "Patient Consent")],
            "patient": patient_ref, "dateTime": iso(when), "performer": [patient_ref],
            "organization": [ref(self.lab)],
            "policyRule": concept(ACT_CODE, "OPTIN", "opt-in"),
            "provision": {"type": "permit", "period": {"start": start},
                          "code": [concept(LOINC, test[0], test[1], text=test[2])]},
        }
        out = [treatment]
        if rng.random() < 0.3:  # results may be shared with relatives / research
            out.append({
                "resourceType": "Consent", "id": self.new_id(), "status": "active",
                "scope": concept(CONSENT_SCOPE, "patient-privacy",
                                 "Privacy Consent"),
                "category": [concept(LOINC, "59284-0", "Patient Consent")],
                "patient": patient_ref, "dateTime": iso(when), "performer": [patient_ref],
                "organization": [ref(self.lab)],
                "policyRule": concept(CONSENT_POLICY, "hipaa-auth",
                                      "HIPAA Authorization"),
                "provision": {"type": "permit", "period": {"start": start},
                              "action": [concept(CONSENT_ACTION, "disclose",
                                                 "Disclose")]},
            })
        if requester and rng.random() < 0.5:
            treatment["provision"]["actor"] = [{
                "role": concept(PARTICIPATION_TYPE, "PRCP",
                                "primary information recipient"),
                "reference": ref(requester)}]
        return out

    def _results(self, subject: dict, specimen: dict, indication: Indication, collected: datetime,
                 issued: datetime, state: str) -> list[dict]:
        """One variant-assessment Observation per gene: a finding (Present) or none found (Absent)."""
        rng = self.rng
        outcome = rng.choices(["positive", "vus", "benign", "negative"], weights=[35, 20, 15, 30])[0]
        wanted = {"positive": ("P", "LP"), "vus": ("VUS",), "benign": ("B",), "negative": ()}[outcome]
        options = [v for v in VARIANTS if v.gene in indication.genes and v.significance in wanted]
        finding = rng.choice(options) if options else None
        genes = list(indication.genes)
        if state == "preliminary" and len(genes) > 1:  # only part of the genes reported so far
            genes = genes[: max(1, len(genes) - 1)]
            if finding and finding.gene not in genes:
                finding = None
        out = []
        for gene in genes:
            variant = finding if finding and finding.gene == gene else None
            obs = {
                "resourceType": "Observation", "id": self.new_id(), "status": state,
                "category": [concept(OBSERVATION_CATEGORY, "laboratory", "Laboratory"), concept(DIAGNOSTIC_SERVICE, "GE", "Genetics")],
                "code": concept(LOINC, "69548-6", "Genetic variant assessment"),
                "subject": subject, "effectiveDateTime": iso(collected), "issued": iso(issued),
                "performer": [ref(self.lab)],
                "valueCodeableConcept": concept(LOINC, *(PRESENT if variant else ABSENT)),
                "method": concept(LOINC, "LA26398-0", "Sequencing"),
                "specimen": ref(specimen),
                "component": [_component("48018-6", "Gene studied [ID]", concept(HGNC, GENE_IDS[gene], gene))],
            }
            if variant:
                obs["component"] += _variant_components(variant)
            out.append(obs)
        return out

    def _conclusion(self, results: list[dict], indication: Indication, state: str) -> str:
        genes = ", ".join(_gene(o) for o in results)
        found = [o for o in results if o["valueCodeableConcept"]["coding"][0]["code"] == PRESENT[0]]
        prefix = "PRELIMINARY: " if state == "preliminary" else ""
        suffix = " Final report to follow." if state == "preliminary" else ""
        if not found:
            return f"{prefix}No pathogenic or likely pathogenic variants detected in {genes}.{suffix}"
        obs = found[0]
        sig = {"P": "Pathogenic", "LP": "Likely pathogenic", "VUS": "Variant of uncertain significance",
               "B": "Benign"}[_significance(obs) or "VUS"]
        change = _component_value(obs, "48004-6")
        protein = _component_value(obs, "48005-3")
        detail = f"{change} ({protein.split(':', 1)[1]})" if protein else change
        tail = {"P": f", consistent with {indication.meaning}.", "LP": f", consistent with {indication.meaning}.",
                "VUS": "; not clinically actionable, reclassification may follow.",
                "B": "; no pathogenic variants detected."}[_significance(obs) or "VUS"]
        return f"{prefix}{sig} variant in {_gene(obs)}: {detail}, heterozygous, germline{tail}{suffix}"

    def _distractors(self, patient: dict, near: datetime, rate: float) -> list[dict]:
        """Chest X-ray reports around the order date: a DiagnosticReport the genetic tasks must not attach."""
        rng = self.rng
        if rng.random() >= rate:
            return []
        out = []
        encounters = self.index.get(patient["id"], "Encounter")
        org_id = next((ref_id(e.get("serviceProvider")) for e in reversed(encounters) if e.get("serviceProvider")), None)
        for _ in range(rng.choice((1, 1, 2))):
            when = near + timedelta(days=rng.randint(-90, 30), hours=rng.randint(-4, 4))
            when = min(when, at(self.ctx.anchor, 0) - timedelta(hours=rng.randint(3, 48)))
            report = {
                "resourceType": "DiagnosticReport", "id": self.new_id(), "status": "final",
                "category": [concept(DIAGNOSTIC_SERVICE, "RAD", "Radiology")],
                "code": concept(LOINC, *CXR),
                "subject": {"reference": f"Patient/{patient['id']}"},
                "effectiveDateTime": iso(when), "issued": iso(when + timedelta(hours=rng.randint(1, 6))),
                "conclusion": rng.choice(CXR_FINDINGS),
            }
            if org_id:
                report["performer"] = [{"reference": f"Organization/{org_id}"}]
            radiologist = self.dir.pick_practitioner(rng, ("Radiol",), org_id)
            if radiologist:
                report["resultsInterpreter"] = [ref(radiologist)]
            out.append(report)
        return out


def _component(code: str, display: str, value: dict) -> dict:
    return {"code": concept(LOINC, code, display), "valueCodeableConcept": value}


def _variant_components(v: Variant) -> list[dict]:
    out = [_component("48004-6", "DNA change (c.HGVS)", concept(HGVS, v.c_hgvs, v.c_hgvs))]
    if v.g_hgvs:
        out.append(_component("81290-9", "Genomic DNA change (gHGVS)", concept(HGVS, v.g_hgvs, v.g_hgvs)))
    if v.p_hgvs:
        out.append(_component("48005-3", "Amino acid change (pHGVS)", concept(HGVS, v.p_hgvs, v.p_hgvs)))
    out += [
        _component("53037-8", "Genetic variation clinical significance [Imp]", concept(LOINC, *SIGNIFICANCE[v.significance])),
        _component("53034-5", "Allelic state", concept(LOINC, *HETEROZYGOUS)),
        _component("48002-0", "Genomic source class [Type]", concept(LOINC, *GERMLINE)),
    ]
    return out


def _component_value(obs: dict, code: str) -> str:
    for comp in obs.get("component", []):
        if comp["code"]["coding"][0]["code"] == code:
            return comp["valueCodeableConcept"]["coding"][0]["code"]
    return ""


def _gene(obs: dict) -> str:
    for comp in obs.get("component", []):
        if comp["code"]["coding"][0]["code"] == "48018-6":
            return comp["valueCodeableConcept"]["coding"][0]["display"]
    return ""


def _significance(obs: dict) -> str | None:
    code = _component_value(obs, "53037-8")
    return next((k for k, (c, _) in SIGNIFICANCE.items() if c == code), None)


# ------------------------------------------------------------------------------------------------
# surgery plans
# ------------------------------------------------------------------------------------------------
def _surgery_plans(ctx: WorldContext, directory: Directory) -> list[dict]:
    rng = ctx.rng("genetics:surgery")
    eligible = _living(ctx, 18)
    count = min(len(eligible), max(3, round(SURGERY_SHARE * len(ctx.patients()))))
    if not count:
        return []
    chosen = sorted(rng.sample(eligible, count), key=eligible.index)
    # days from the anchor: inside the 14-day window, after it, and in the past; then any of these
    windows = [(1, 13), (18, 60), (-45, -3)]  # clear of day 14, whatever time of day "now" is
    rng.shuffle(windows)
    windows += rng.choices([(1, 13), (16, 75), (-60, -1)], k=max(0, count - 3))
    out = []
    for n, (patient, (lo, hi)) in enumerate(zip(chosen, windows)):
        # the task's procedure (appendectomy) both inside and after the window, then a mix
        first_future = n < 3 and lo > 0
        code, display, reason, specialties = (SURGERIES[0] if first_future or rng.random() < 0.5
                                              else rng.choice(SURGERIES))
        offset = rng.randint(lo, hi)
        when = at(ctx.day(offset), rng.choice((7, 8, 9, 10, 11, 13, 14)), rng.choice((0, 15, 30, 45)))
        authored = at(ctx.day(min(-1, offset - rng.randint(3, 21))), rng.randint(9, 17), rng.randint(0, 59))
        surgeon = directory.pick_practitioner(rng, specialties)
        plan: dict = {
            "resourceType": "ServiceRequest", "id": ctx.new_id("genetics:surgery"),
            "status": "completed" if offset < 0 else "active", "intent": "order",
            "category": [concept(SNOMED, "387713003", "Surgical procedure")],
            "code": concept(SNOMED, code, display),
            "subject": {"reference": f"Patient/{patient['id']}"},
            "occurrenceDateTime": iso(when), "authoredOn": iso(authored),
            "reasonCode": [concept(SNOMED, *reason) if reason else {"text": SURGERY_REASON_TEXT[code]}],
        }
        if surgeon:
            plan["requester"] = ref(surgeon)
            plan["performer"] = [ref(surgeon)]
        out.append(plan)
    return out



def _onset_age(rng: Random, lo: int, hi: int) -> dict:
    """An onset age between ``lo`` and ``hi`` years. Ages must be positive (invariant ``age-1``): a range
    starting in the first year (cystic fibrosis, found in infancy) is drawn in months, 1 to ``hi`` years."""
    if lo > 0:
        return {"value": rng.randint(lo, hi), "unit": "a", "system": UCUM, "code": "a"}
    return {"value": rng.randint(1, 12 * hi), "unit": "mo", "system": UCUM, "code": "mo"}
