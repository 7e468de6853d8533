"""benchmarks/draft_grounding.py: drafts counted by whether their answer occurs in their own passages."""

from benchmarks.draft_grounding import grounding

ROWS = {
    "q1": {
        "question_id": "q1",
        "ground_truth": ["Paris"],
        "context": [{"title": "France", "text": "Paris is the capital."}, "Berlin is in Germany.", ""],
    }
}


def draft(index, answer, doc_ids, parsed=True):
    return {"index": index, "answer": answer, "doc_ids": doc_ids, "parsed": parsed}


def test_grounded_and_ungrounded_drafts_are_counted_with_their_accuracy():
    preds = [
        {
            "method": "speculative",
            "question_id": "q1",
            "path": "verified_draft",
            "chosen_draft": 1,
            "correct": False,
            "drafts": [
                draft(0, "Paris", ["ctx0"]),  # grounded, right
                draft(1, "Berlin", ["ctx1"]),  # grounded, wrong (and the cascade accepted it)
                draft(2, "Paris", ["ctx1"]),  # right, but its passages do not hold it
                draft(3, "Lyon", ["ctx0", "ctx1"]),  # neither
                draft(4, "", ["ctx0"], parsed=False),  # unparsed drafts are left out
            ],
        },
        {"method": "standard", "question_id": "q1", "correct": True},
    ]
    res = grounding(preds, ROWS)
    assert (res["grounded_drafts"], res["grounded_right"]) == (2, 1)
    assert (res["ungrounded_drafts"], res["ungrounded_right"]) == (2, 1)
    assert res["accepted"] == [{"question_id": "q1", "grounded": True, "correct": False}]


def test_a_fallback_lists_no_accepted_draft():
    preds = [
        {
            "method": "speculative",
            "question_id": "q1",
            "path": "fallback",
            "chosen_draft": None,
            "correct": True,
            "drafts": [draft(0, "Paris", ["ctx0"])],
        }
    ]
    res = grounding(preds, ROWS)
    assert res["accepted"] == [] and res["grounded_accuracy"] == 1.0 and res["ungrounded_drafts"] == 0


def test_a_drafts_only_run_is_read_from_random_draft_with_its_oracle_and_baselines():
    drafts = [draft(0, "Lyon", ["ctx0"]), draft(1, "Paris", ["ctx0"])]
    preds = [
        {"method": "random_draft", "question_id": "q1", "correct": False, "drafts": drafts},
        {"method": "drafter_only", "question_id": "q1", "correct": True, "drafts": drafts},
    ]
    res = grounding(preds, ROWS)
    assert (res["questions"], res["drafts_right"], res["oracle"]) == (1, 1, 1)  # the drafts counted once
    assert (res["random_draft_right"], res["drafter_only_right"]) == (0, 1)
    assert (res["grounded_drafts"], res["grounded_right"]) == (1, 1)  # "Lyon" is not in ctx0
