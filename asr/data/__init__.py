"""Corpora, tokenisers and batching: from folders of audio to padded batches.

Reading only: the synthetic corpora are made by :mod:`asr.synthesis`, which this package never imports.

    corpus.load_split            read a recipe's split (its data sources + FSDD connected digits)
      sources.read_source          one source, in the form its path shows:
        librispeech.read_subset      a LibriSpeech-layout folder, durations cached in a manifest
        kaldi.read_kaldi_dir         a Kaldi data directory (wav.scp, text, segments, utt2spk)
        manifests.read_manifest      a lhotse manifest (CutSet, or recordings + supervisions)
      fsdd.connected_digits        connected-digit utterances built in memory from FSDD takes
      demo.corpus_subsets          the prepared demo corpus, found by the settings that asked for it (made
                                   beforehand by python -m asr.synth_demo, asr.synthesis); never synthesised here
    corpus.build_tokenizer       characters or sentencepiece BPE (tokenizer.py); PAD=0 SOS=1 EOS=2 UNK=3
    dataset.prepare_utterances   one-shot validation; every skip recorded in a report.SkipReport
    dataset.SpeechDataset        utterance -> features (features.pipeline) + token ids
    (training.data.make_loader   batching.BucketBatchSampler + batching.collate -> batching.Batch)

Preparing a run (manifest durations, BPE, dataset.cached_global_stats) is spread over
processes by parallel.map_chunks and kept for the next run in the cache folder (cache.py).

Every transcript passes through :func:`asr.data.text.normalize_text`, which
WER scoring uses too.
"""
