-- Reviewing changes: who marked a change reviewed (or dismissed it), when, and why. The review
-- queue is the changes that require review and have no review_outcome yet. See
-- plugins/harvester/store/review.py (the Harvester page in the Airflow UI and `harvester review`).
ALTER TABLE dataset_changes
    ADD COLUMN reviewed_at    timestamptz,
    ADD COLUMN reviewed_by    text,
    ADD COLUMN review_note    text,
    ADD COLUMN review_outcome text CHECK (review_outcome IN ('reviewed', 'dismissed')),
    -- a review is recorded whole: outcome, who and when together, or none of them
    ADD CONSTRAINT dataset_changes_review_complete CHECK (
        (review_outcome IS NULL AND reviewed_at IS NULL AND reviewed_by IS NULL AND review_note IS NULL)
        OR (review_outcome IS NOT NULL AND reviewed_at IS NOT NULL AND reviewed_by IS NOT NULL));

-- The queue, newest first (the existing dataset_changes_review index also holds reviewed changes).
CREATE INDEX dataset_changes_queue ON dataset_changes (detected_at DESC, id DESC)
    WHERE requires_review AND review_outcome IS NULL;
