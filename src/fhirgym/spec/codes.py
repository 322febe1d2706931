"""Code systems and identifier systems by name: one home for the URLs tasks (and their checks) use.

Plain constants, so that a family writes ``codes.LOINC`` and a typo is a NameError, not a silent miss.
"""

SNOMED = "http://snomed.info/sct"
LOINC = "http://loinc.org"
UCUM = "http://unitsofmeasure.org"
RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"
CVX = "http://hl7.org/fhir/sid/cvx"
ICD10CM = "http://hl7.org/fhir/sid/icd-10-cm"
#: the MRN system of the world's patients (Synthea's)
MRN = "http://hospital.smarthealthit.org"

_THO = "http://terminology.hl7.org/CodeSystem/"
ACT_CODE = _THO + "v3-ActCode"
ACT_SITE = _THO + "v3-ActSite"
ROLE_CODE = _THO + "v3-RoleCode"
PARTICIPATION_TYPE = _THO + "v3-ParticipationType"
APPOINTMENT_TYPE = _THO + "v2-0276"
DIAGNOSTIC_SERVICE = _THO + "v2-0074"
IDENTIFIER_TYPE = _THO + "v2-0203"
CANCELLATION_REASON = _THO + "appointment-cancellation-reason"
OBSERVATION_CATEGORY = _THO + "observation-category"
CONDITION_CLINICAL = _THO + "condition-clinical"
CONDITION_VERIFICATION = _THO + "condition-ver-status"
ALLERGY_CLINICAL = _THO + "allergyintolerance-clinical"
ALLERGY_VERIFICATION = _THO + "allergyintolerance-verification"
SUBSCRIBER_RELATIONSHIP = _THO + "subscriber-relationship"
COVERAGE_CLASS = _THO + "coverage-class"
ORGANIZATION_TYPE = _THO + "organization-type"
ADMINISTRATIVE_GENDER = "http://hl7.org/fhir/administrative-gender"
CONFIDENTIALITY = _THO + "v3-Confidentiality"
