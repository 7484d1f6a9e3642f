"""Hand-written English-Japanese patent lexicon behind `data_prep.demo_corpus`.

Each table is plain text (one entry a line, fields split by `|`) so the data reads like a glossary.
English is lowercased and space-tokenized; Japanese is tokenized the way KyTea splits it
(`制御 部`, `結合 さ れ た`). Every English entry has exactly one Japanese rendering, which is what
lets a model reach high BLEU: the difficulty is the reordering, not the word choice.

Rules the grammar relies on (checked in tests/test_demo_corpus.py):
- no noun starts with a word that is also an adjective or ordinal (`a first conductive layer`
  must have one reading);
- every verb's Japanese ends in a dictionary form (`する`, `せる`, `る`), so clauses are verb-final;
- relation stems end in the passive `れ`, so `+ た` is the prenominal form and `+ る` the final one.
"""
from __future__ import annotations

from typing import NamedTuple


class Noun(NamedTuple):
    en: str
    ja: str
    plural: str


class Word(NamedTuple):
    en: str
    ja: str


class Verb(NamedTuple):
    base: str
    third: str  # "adjusts"
    gerund: str  # "adjusting"
    ja: str  # dictionary form, "調整 する"


class Relation(NamedTuple):
    """A passive participle with its object: `coupled to X` -> `X に 結合 さ れ た`."""

    en: str
    post: str  # what follows the object: "に", "上 に", "に よっ て"
    stem: str  # passive stem: "結合 さ れ"; + "た" before a noun, + "る" at the end of a clause


def _rows(text: str) -> list[list[str]]:
    return [[f.strip() for f in line.split("|")] for line in text.strip().splitlines()]


def _plural(en: str) -> str:
    *rest, last = en.split()
    if last.endswith(("s", "x", "ch", "sh")):
        last += "es"
    elif last.endswith("y") and last[-2] not in "aeiou":
        last = last[:-1] + "ies"
    else:
        last += "s"
    return " ".join([*rest, last])


def _nouns(text: str) -> tuple[Noun, ...]:
    return tuple(Noun(r[0], r[1], r[2] if len(r) > 2 else _plural(r[0])) for r in _rows(text))


def _words(text: str) -> tuple[Word, ...]:
    return tuple(Word(*r) for r in _rows(text))


# Physical parts of a claimed thing; they are introduced with "a" and can carry relative clauses.
COMPONENTS = _nouns("""
housing | 筐体
sensor | センサ
controller | 制御 部
processor | プロセッサ
memory | メモリ | memories
substrate | 基板
electrode | 電極
layer | 層
circuit | 回路
valve | 弁
pump | ポンプ
motor | モータ
shaft | 軸
gear | ギア
spring | ばね
lens | レンズ
light source | 光源
display unit | 表示 部
battery | 電池
antenna | アンテナ
transistor | トランジスタ
capacitor | キャパシタ
resistor | 抵抗 器
inductor | インダクタ
diode | ダイオード
semiconductor chip | 半導体 チップ
wiring | 配線
terminal | 端子
connector | コネクタ
cable | ケーブル
frame | フレーム
chamber | チャンバ
nozzle | ノズル
pipe | 配管
tank | タンク
filter | フィルタ
membrane | 膜
film | フィルム
plate | プレート
cover | カバー
lid | 蓋
bracket | ブラケット
rotor | ロータ
stator | ステータ
coil | コイル
magnet | 磁石
bearing | 軸受
piston | ピストン
cylinder | シリンダ
roller | ローラ
belt | ベルト
blade | ブレード
fan | ファン
heater | ヒータ
heat sink | ヒート シンク
cooling unit | 冷却 部
actuator | アクチュエータ
switch | スイッチ
transmitter | 送信 部
receiver | 受信 部
communication unit | 通信 部
storage unit | 記憶 部
processing unit | 処理 部
detection unit | 検出 部
determination unit | 判定 部
calculation unit | 算出 部
acquisition unit | 取得 部
generation unit | 生成 部
output unit | 出力 部
input unit | 入力 部
image sensor | イメージ センサ
camera | カメラ
light emitting element | 発光 素子
light receiving element | 受光 素子
optical fiber | 光 ファイバ
waveguide | 導波 路
mirror | ミラー
prism | プリズム
polarizer | 偏光 子
gate electrode | ゲート 電極
source electrode | ソース 電極
drain electrode | ドレイン 電極
channel region | チャネル 領域
semiconductor layer | 半導体 層
oxide film | 酸化 膜
protective film | 保護 膜
adhesive layer | 接着 層
support member | 支持 部材
fixing member | 固定 部材
sealing member | 封止 部材
holding member | 保持 部材
base | 基部
arm | アーム
link | リンク
hinge | ヒンジ
wheel | 車輪
tire | タイヤ
brake | ブレーキ
engine | エンジン
transmission | 変速 機
steering wheel | ステアリング ホイール
seat | シート
door | ドア
window | 窓
panel | パネル
touch panel | タッチ パネル
keyboard | キーボード
speaker | スピーカ
microphone | マイクロ ホン
server | サーバ
network interface | ネットワーク インタフェース
bus | バス
register | レジスタ
buffer | バッファ
cache | キャッシュ
encoder | エンコーダ
decoder | デコーダ
amplifier | 増幅 器
oscillator | 発振 器
converter | 変換 器
inverter | インバータ
power supply | 電源 | power supplies
voltage regulator | 電圧 レギュレータ
comparator | 比較 器
counter | カウンタ
timer | タイマ
clock generator | クロック 生成 部
catheter | カテーテル
needle | 針
syringe | シリンジ
electrode pad | 電極 パッド
probe | プローブ
container | 容器
bottle | ボトル
cap | キャップ
handle | ハンドル
grip | グリップ
screw | ねじ
bolt | ボルト
nut | ナット
washer | ワッシャ
gasket | ガスケット
seal | シール
spacer | スペーサ
partition wall | 仕切り 壁
flow path | 流路
inlet | 入口
outlet | 出口
opening | 開口
groove | 溝
protrusion | 突起
recess | 凹部
through hole | 貫通 孔
fin | フィン
duct | ダクト
compressor | 圧縮 機
evaporator | 蒸発 器
condenser | 凝縮 器
heat exchanger | 熱 交換 器
reactor | 反応 器
catalyst | 触媒
separator | セパレータ
positive electrode | 正極
negative electrode | 負極
current collector | 集電 体
""")

# What a device claim claims ("a semiconductor device comprising ..."); no relative clauses.
HEADS = _nouns("""
device | 装置
apparatus | 機器 | apparatuses
system | システム
semiconductor device | 半導体 装置
display device | 表示 装置
imaging device | 撮像 装置
image processing apparatus | 画像 処理 装置 | image processing apparatuses
information processing apparatus | 情報 処理 装置 | information processing apparatuses
vehicle | 車両
robot | ロボット
power conversion device | 電力 変換 装置
battery pack | 電池 パック
light emitting device | 発光 装置
measuring device | 測定 装置
medical device | 医療 機器
endoscope | 内視鏡
printer | プリンタ
air conditioner | 空気 調和 機
fuel cell | 燃料 電池
lithium ion battery | リチウム イオン 電池
circuit board | 回路 基板
optical module | 光 モジュール
sensor module | センサ モジュール
electronic device | 電子 機器
communication device | 通信 装置
substrate processing apparatus | 基板 処理 装置 | substrate processing apparatuses
exhaust gas purification device | 排 ガス 浄化 装置
hydraulic pump | 油圧 ポンプ
wind turbine | 風力 タービン
""")

# Heads of "the X of Y" phrases: regions of a component ...
PARTS = _words("""
surface | 表面
upper surface | 上面
lower surface | 下面
side surface | 側面
end | 端部
edge | 縁部
portion | 部分
center | 中心
periphery | 周縁 部
outer periphery | 外周
inner wall | 内壁
outer wall | 外壁
bottom | 底部
top | 頂部
interior | 内部
corner | 角部
tip | 先端
rear end | 後端
front end | 前端
region | 領域
""")

# ... and quantities of a component ("the temperature of the chamber").
PROPERTIES = _words("""
temperature | 温度
pressure | 圧力
thickness | 厚さ
width | 幅
length | 長さ
height | 高さ
diameter | 直径
voltage | 電圧
current | 電流
resistance | 抵抗 値
frequency | 周波 数
speed | 速度
rotational speed | 回転 数
position | 位置
angle | 角度
orientation | 向き
intensity | 強度
luminance | 輝度
wavelength | 波長
flow rate | 流量
concentration | 濃度
density | 密度
viscosity | 粘度
humidity | 湿度
weight | 重量
volume | 体積
capacity | 容量
power consumption | 消費 電力
output | 出力
distance | 距離
displacement | 変位
vibration | 振動
amount | 量
level | レベル
state | 状態
phase | 位相
impedance | インピーダンス
capacitance | 静電 容量
refractive index | 屈折 率
transmittance | 透過 率
reflectance | 反射 率
""")

MATERIALS = _words("""
copper | 銅
aluminum | アルミニウム
silicon | シリコン
silicon oxide | 酸化 シリコン
silicon nitride | 窒化 シリコン
gold | 金
silver | 銀
nickel | ニッケル
titanium | チタン
tungsten | タングステン
stainless steel | ステンレス 鋼
iron | 鉄
glass | ガラス
ceramic | セラミック
resin | 樹脂
rubber | ゴム
polyimide | ポリイミド
polyethylene | ポリエチレン
carbon | 炭素
graphite | 黒鉛
indium tin oxide | 酸化 インジウム スズ
gallium nitride | 窒化 ガリウム
sapphire | サファイア
quartz | 石英
zinc oxide | 酸化 亜鉛
""")

# Ordinals come first in English and Japanese alike: "a first conductive layer" -> "第 1 の 導電 性 の 層".
ORDINALS = _words("""
first | 第 1 の
second | 第 2 の
third | 第 3 の
fourth | 第 4 の
""")

ADJECTIVES = _words("""
conductive | 導電 性 の
insulating | 絶縁 性 の
flexible | 可撓 性 の
transparent | 透明 な
elastic | 弾性 の
annular | 環状 の
cylindrical | 円筒 状 の
rectangular | 矩形 の
planar | 平面 状 の
porous | 多孔 質 の
magnetic | 磁性 の
thin | 薄い
thick | 厚い
hollow | 中空 の
movable | 可動 の
rotatable | 回転 可能 な
detachable | 着脱 可能 な
auxiliary | 補助 の
upper | 上側 の
lower | 下側 の
inner | 内側 の
outer | 外側 の
lateral | 側方 の
metallic | 金属 製 の
optical | 光学 的 な
predetermined | 所定 の
additional | 追加 の
single | 単一 の
common | 共通 の
separate | 別個 の
external | 外部 の
internal | 内部 の
waterproof | 防水 性 の
heat resistant | 耐熱 性 の
tubular | 管状 の
""")

VERBS = tuple(Verb(*r) for r in _rows("""
adjust | adjusts | adjusting | 調整 する
measure | measures | measuring | 測定 する
detect | detects | detecting | 検出 する
control | controls | controlling | 制御 する
determine | determines | determining | 決定 する
calculate | calculates | calculating | 算出 する
estimate | estimates | estimating | 推定 する
generate | generates | generating | 生成 する
transmit | transmits | transmitting | 送信 する
receive | receives | receiving | 受信 する
store | stores | storing | 記憶 する
acquire | acquires | acquiring | 取得 する
monitor | monitors | monitoring | 監視 する
change | changes | changing | 変更 する
increase | increases | increasing | 増加 さ せる
decrease | decreases | decreasing | 減少 さ せる
maintain | maintains | maintaining | 維持 する
limit | limits | limiting | 制限 する
correct | corrects | correcting | 補正 する
supply | supplies | supplying | 供給 する
discharge | discharges | discharging | 排出 する
heat | heats | heating | 加熱 する
cool | cools | cooling | 冷却 する
rotate | rotates | rotating | 回転 さ せる
move | moves | moving | 移動 さ せる
drive | drives | driving | 駆動 する
press | presses | pressing | 押圧 する
hold | holds | holding | 保持 する
support | supports | supporting | 支持 する
form | forms | forming | 形成 する
etch | etches | etching | エッチング する
deposit | deposits | depositing | 堆積 さ せる
remove | removes | removing | 除去 する
coat | coats | coating | 被覆 する
irradiate | irradiates | irradiating | 照射 する
emit | emits | emitting | 出射 する
convert | converts | converting | 変換 する
amplify | amplifies | amplifying | 増幅 する
compare | compares | comparing | 比較 する
display | displays | displaying | 表示 する
process | processes | processing | 処理 する
encode | encodes | encoding | 符号 化 する
decode | decodes | decoding | 復号 する
output | outputs | outputting | 出力 する
identify | identifies | identifying | 特定 する
select | selects | selecting | 選択 する
switch | switches | switching | 切り替える
inspect | inspects | inspecting | 検査 する
clean | cleans | cleaning | 洗浄 する
seal | seals | sealing | 封止 する
cut | cuts | cutting | 切断 する
bond | bonds | bonding | 接合 する
polish | polishes | polishing | 研磨 する
stop | stops | stopping | 停止 さ せる
manufacture | manufactures | manufacturing | 製造 する
assemble | assembles | assembling | 組み立てる
operate | operates | operating | 動作 さ せる
calibrate | calibrates | calibrating | 校正 する
inject | injects | injecting | 注入 する
mix | mixes | mixing | 混合 する
analyze | analyzes | analyzing | 解析 する
evaluate | evaluates | evaluating | 評価 する
record | records | recording | 記録 する
transfer | transfers | transferring | 搬送 する
align | aligns | aligning | 位置 合わせ する
"""))

# Verbs that make a sensible "a method of <gerund> a <head>".
METHOD_VERBS = tuple(v for v in VERBS if v.base in {
    "manufacture", "control", "operate", "inspect", "assemble", "calibrate", "drive", "evaluate", "clean",
})

RELATIONS = tuple(Relation(*r) for r in _rows("""
coupled to | に | 結合 さ れ
connected to | に | 接続 さ れ
electrically connected to | に | 電気 的 に 接続 さ れ
attached to | に | 取り付け られ
fixed to | に | 固定 さ れ
mounted on | 上 に | 実装 さ れ
disposed on | 上 に | 配置 さ れ
disposed in | 内 に | 配置 さ れ
formed on | 上 に | 形成 さ れ
formed in | 内 に | 形成 さ れ
provided in | に | 設け られ
provided on | 上 に | 設け られ
arranged along | に 沿っ て | 配列 さ れ
embedded in | に | 埋め込ま れ
accommodated in | 内 に | 収容 さ れ
housed in | 内 に | 格納 さ れ
supported by | に よっ て | 支持 さ れ
driven by | に よっ て | 駆動 さ れ
controlled by | に よっ て | 制御 さ れ
covered with | で | 覆わ れ
filled with | で | 充填 さ れ
surrounded by | に よっ て | 囲ま れ
stacked on | 上 に | 積層 さ れ
bonded to | に | 接合 さ れ
welded to | に | 溶接 さ れ
inserted into | に | 挿入 さ れ
positioned above | の 上方 に | 配置 さ れ
positioned below | の 下方 に | 配置 さ れ
"""))

# Prepositional adjuncts of a method step: "forming X on the substrate" -> "基板 上 に X を 形成 する".
ADJUNCTS = _words("""
on | 上 に
in | 内 に
to | に
from | から
with | で
using | を 用い て
""")

# Comparison targets in "when the pressure of the tank exceeds a threshold".
LIMITS = _words("""
a threshold | 閾値
a predetermined value | 所定 値
a reference value | 基準 値
an upper limit | 上限 値
a lower limit | 下限 値
""")

# The monotone baseline's glosses for the grammar's function words ("" = dropped).
FUNCTION_GLOSSES = {
    "a": "", "an": "", "the": "", ":": "", "wherein": "", "is": "",
    ",": "、", ";": "、", ".": "。", "of": "の", "and": "及び", "to": "に", "on": "上 に", "in": "内 に",
    "from": "から", "with": "で", "using": "用い て", "based": "基づい て",
    "comprising": "備える", "comprises": "備える", "includes": "含む", "further": "さらに",
    "configured": "構成 さ れ た", "made": "形成 さ れ た", "having": "有する", "for": "ため の",
    "method": "方法", "claim": "請求 項", "according": "記載 の", "plurality": "複数",
    "greater": "大きい", "less": "小さい", "than": "より", "when": "と", "whether": "か 否 か",
    "exceeds": "超える", "falls": "下回る", "below": "", "threshold": "閾値", "value": "値",
    "reference": "基準", "limit": "値",
}
