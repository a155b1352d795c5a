"""The pipeline's monitoring agent (``fairstream monitor``): one set of fairness numbers per pipeline.

Workers count the records they deliver and send their partial aggregates to the stats topic; the agent merges them
into the pipeline's windows (:mod:`.pipeline`, slice by slice: :mod:`.slices`), exports the pipeline's gauges,
detects drift once and asks one re-fit per drift, and applies the shadow policy (:mod:`.promotion`) to every
worker's paired evidence pooled (:mod:`.service`, the process).
"""
