-- A portal marked in dataset_vectors_checked for a model now also tells a run where to look for
-- texts still to embed (vectors._pending): its live datasets linked to their current text
-- (embedded_content_hash = content_hash) have a vector of that model, so only the unlinked ones,
-- found through the datasets_pending partial index, are checked against embeddings. At 100,000
-- datasets that probe of embeddings for every dataset was most of a no-change run's own time.
--
-- What keeps the mark true: it is set by a pass that found every live dataset with its copy (so
-- with its vector); a run of another model replaces or removes it in the same transaction as its
-- merge; a dataset back from removal is unlinked, then linked again to the run's model (merge);
-- and, here, a vector deleted from embeddings (`harvester embeddings invalidate`, by hand) also
-- removes the marks, for its model, of the portals that have a dataset of its text. Vectors
-- `harvester embeddings prune` deletes belong to no dataset: no mark changes.
CREATE OR REPLACE FUNCTION harvester_vectors_deleted() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    DELETE FROM dataset_vectors v
    USING gone g, dataset_search s
    WHERE s.content_hash = g.content_hash AND v.dataset_id = s.dataset_id AND v.model = g.model;
    DELETE FROM dataset_vectors_checked c
    USING gone g, datasets d
    WHERE d.content_hash = g.content_hash AND c.portal_url = d.portal_url AND c.model = g.model;
    RETURN NULL;
END
$$;
