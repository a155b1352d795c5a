"""fairstream.repair.measure: fairness measurement, batch and streaming.

- ``metrics``: batch metrics (dependence E, demographic parity, conditional DP, W1, damage, AUC);
- ``accumulators`` and ``windows``: mergeable streaming accumulators and the sliding windows that hold them;
- ``mdp``: matched demographic parity (batch and streaming), the fair matching function and its transport cost;
- ``otf``: OTF0, the transport cost of making a batch's scores fair, its gradient and a window statistic;
- ``evaluation``: one evaluation of a repair, shared by the batch job, the reproductions and the stream report;
- ``verification``: face-verification metrics (pair scores, per-group FAR/FRR, BFAR/BFRR).
"""
