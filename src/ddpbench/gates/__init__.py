"""The regression gates: one vocabulary (:mod:`.verdict_words`), one report (:mod:`.verdicts`), one
statistics module on scipy.stats (:mod:`.stats`), and the two ways to judge a change:

* :mod:`.compare` -- two stored runs (``ddpbench compare``), normalised for machine drift by the
  CPU probe of :mod:`.calibration` where that probe speaks for the cases;
* :mod:`.ab` -- a baseline and a candidate interleaved in one pytest run.
"""
