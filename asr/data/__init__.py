"""Corpora, tokenisers and batching: from folders of audio to padded batches.

    corpus.load_split            read a recipe's split (LibriSpeech-layout subsets + FSDD connected digits)
      librispeech.read_subset      one LibriSpeech-layout folder, durations cached in a manifest
      fsdd.connected_digits        connected-digit utterances built in memory from FSDD takes
    corpus.build_tokenizer       characters or sentencepiece BPE (tokenizer.py); PAD=0 SOS=1 EOS=2 UNK=3
    dataset.prepare_utterances   one-shot validation; every skip recorded in a report.SkipReport
    dataset.SpeechDataset        utterance -> features (features.pipeline) + token ids
    dataset.make_data_loader     batching.BucketBatchSampler + batching.collate -> batching.Batch

Preparing a run (manifest durations, BPE, dataset.cached_global_stats) is spread over
processes by parallel.map_chunks and kept for the next run in the cache folder (cache.py).

Every transcript passes through :func:`asr.data.text.normalize_text`, which
WER scoring uses too.
"""
