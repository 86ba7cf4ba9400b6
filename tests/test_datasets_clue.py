"""CLUEForCLS and CLUEForMLM over CLUE JSON lines and a text corpus converted by the real converters."""

from __future__ import annotations

import json

import pytest
import torch

import hfai.datasets as datasets
from hfai.datasets import base
from hfai.datasets.clue import IGNORE_INDEX
from hfai.datasets.convert_clue import convert_clue_corpus, convert_clue_task
from hfai.datasets.errors import ConvertError, DatasetNotFoundError
from hfai.datasets.vocab import Vocab

TRAIN = [
    {"label": "1", "label_des": "地图", "sentence": "高德地图导航"},
    {"label": "0", "label_des": "打车", "sentence": "滴滴打车 App 好用"},
    {"label": "2", "label_des": "音乐", "sentence": "听音乐"},
]
CORPUS = ["今天天气很好。", "我们去公园散步吧", "这是第三行文本，比较长一些，用来测试切分的逻辑。", "短句"]


def write_lines(path, rows) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(base, "_data_dir", None)
    datasets.set_data_dir(tmp_path / "datasets")
    return tmp_path / "datasets"


@pytest.fixture
def task(tmp_path):
    src = tmp_path / "iflytek_public"
    src.mkdir()
    write_lines(src / "train.json", TRAIN)
    write_lines(src / "dev.json", [{"label": "2", "sentence": "音乐"}])
    write_lines(src / "test.json", [{"id": 0, "sentence": "地图"}])
    # labels.json fixes the class order (here not the sorted one)
    write_lines(src / "labels.json", [{"label": "2", "label_des": "音乐"}, {"label": "0", "label_des": "打车"},
                                      {"label": "1", "label_des": "地图"}])
    return src


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus"
    path.mkdir()
    (path / "a.txt").write_text("\n".join(CORPUS[:2]) + "\n\n", encoding="utf-8")
    (path / "b.txt").write_text("\n".join(CORPUS[2:]) + "\n", encoding="utf-8")
    return path


def test_cls_items_are_padded_ids_mask_and_class(task, corpus, data_dir):
    convert_clue_corpus(corpus, data_dir)  # builds DST/CLUE/vocab.txt; the task reuses it
    convert_clue_task(task, data_dir, max_length=8)
    vocab = Vocab.load(data_dir / "CLUE" / "vocab.txt")
    train = datasets.CLUEForCLS(dataset_name="iflytek", split="train")
    assert train.classes == ["2", "0", "1"] and train.label_descriptions == ["音乐", "打车", "地图"]
    assert len(train) == 3
    seq, mask, label = train[[0]][0]
    expected = [vocab.cls, *vocab.encode("高德地图导航"), vocab.sep]
    assert seq.dtype == torch.int64 and seq.tolist() == expected + [0] * (8 - len(expected))
    assert mask.dtype == torch.bool and mask.tolist() == [False] * len(expected) + [True] * (8 - len(expected))
    assert label.item() == 2  # "1" is the third class in labels.json
    long_one = train[[1]][0][0]
    assert long_one.tolist()[-1] == vocab.sep and len(long_one) == 8  # cut to max_length, [SEP] kept
    assert datasets.CLUEForCLS("iflytek", "dev")[[0]][0][2].item() == 0
    assert datasets.CLUEForCLS("iflytek", "test")[[0]][0][2].item() == -1
    batches = list(train.loader(2))
    assert [b[2].tolist() for b in batches] == [[2, 1], [0]] and batches[0][0].shape == (2, 8)


def test_sentence_pairs_and_unknown_characters(tmp_path, data_dir):
    src = tmp_path / "afqmc_public"
    src.mkdir()
    write_lines(src / "train.json", [{"sentence1": "花呗", "sentence2": "借呗还款", "label": "1"},
                                     {"sentence1": "abc", "sentence2": "花", "label": "0"}])
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n花\n呗\nabc\n", encoding="utf-8")
    convert_clue_task(src, data_dir, vocab=vocab_file, max_length=7)
    ds = datasets.CLUEForCLS("afqmc", "train")
    assert ds.classes == ["0", "1"]
    # [CLS] 花 呗 [SEP] 借->[UNK] 呗 [SEP] (the longer sentence cut first: 还款 dropped)
    assert ds[[0]][0][0].tolist() == [2, 5, 6, 3, 1, 6, 3]
    assert ds[[1]][0][0].tolist() == [2, 7, 3, 5, 3, 0, 0]  # a known word is one token


def test_mlm_masks_real_tokens_only_and_the_same_way_each_read(corpus, data_dir):
    convert_clue_corpus(corpus, data_dir, max_length=16)
    mlm = datasets.CLUEForMLM()
    vocab = mlm.vocab
    specials = {vocab.pad, vocab.cls, vocab.sep, vocab.unk, vocab.mask}
    # every line's tokens, in order, across the packed sequences
    packed = []
    for seq, mask, label in mlm[list(range(len(mlm)))]:
        original = torch.where(label != IGNORE_INDEX, label, seq)
        real = original[~mask].tolist()
        assert real[0] == vocab.cls and real[-1] == vocab.sep and len(real) <= 16
        packed += real[1:-1]
        chosen = (label != IGNORE_INDEX).nonzero().flatten().tolist()
        assert chosen and all(original[i].item() not in specials for i in chosen)
        assert not mask[chosen].any()
    assert packed == [t for line in CORPUS for t in vocab.encode(line)]
    again = mlm[[1, 0]]
    first = mlm[[0, 1]]
    assert all(torch.equal(a, b) for x, y in zip(again, first[::-1], strict=True) for a, b in zip(x, y, strict=True))


def test_mlm_mask_rates(tmp_path, data_dir):
    (tmp_path / "c.txt").write_text(("天地玄黄宇宙洪荒日月盈昃辰宿列张" * 4 + "\n") * 300, encoding="utf-8")
    convert_clue_corpus(tmp_path / "c.txt", data_dir, max_length=66)
    mlm = datasets.CLUEForMLM(seed=7)
    chosen = replaced = kept = 0
    for seq, _, label in mlm[list(range(len(mlm)))]:
        picked = label != IGNORE_INDEX
        chosen += int(picked.sum())
        replaced += int((seq[picked] == mlm.vocab.mask).sum())
        kept += int((seq[picked] == label[picked]).sum())
    assert chosen == len(mlm) * round(64 * 0.15)
    assert 0.75 < replaced / chosen < 0.85 and 0.06 < kept / chosen < 0.14


def test_vocab_must_agree_and_be_well_formed(task, tmp_path, data_dir):
    convert_clue_task(task, data_dir)
    other = tmp_path / "other.txt"
    other.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n某\n", encoding="utf-8")
    with pytest.raises(ConvertError, match="differs"):
        convert_clue_corpus(task / "train.json", data_dir, vocab=other)
    bad = tmp_path / "bad.txt"
    bad.write_text("[UNK]\n[PAD]\n[CLS]\n[SEP]\n[MASK]\n", encoding="utf-8")
    with pytest.raises(ConvertError, match=r"\[PAD\] must be the first line"):
        convert_clue_corpus(task / "train.json", tmp_path / "elsewhere", vocab=bad)


def test_bad_json_line_names_file_and_line(task, data_dir):
    with open(task / "dev.json", "a", encoding="utf-8") as f:
        f.write("{not json\n")
    with pytest.raises(ConvertError, match=r"dev.json:2: not a JSON line"):
        convert_clue_task(task, data_dir)
    assert not (data_dir / "CLUE" / "iflytek" / "train.ffr").exists()


def test_not_there_names_the_path(data_dir):
    with pytest.raises(DatasetNotFoundError) as e:
        datasets.CLUEForMLM()
    assert str(data_dir / "CLUE" / "corpus.ffr") in str(e.value) and "clue-corpus" in str(e.value)
    with pytest.raises(DatasetNotFoundError, match=str(data_dir / "CLUE" / "tnews" / "dev.ffr")):
        datasets.CLUEForCLS("tnews", "dev")


def test_vocab_built_from_the_text_has_specials_then_frequent_characters(corpus, data_dir):
    convert_clue_corpus(corpus, data_dir, vocab_size=8)
    tokens = (data_dir / "CLUE" / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(tokens) == 8
    text = "".join(CORPUS)
    left_out = set(text) - set(tokens)
    assert left_out and min(text.count(ch) for ch in tokens[5:]) >= max(text.count(ch) for ch in left_out)
