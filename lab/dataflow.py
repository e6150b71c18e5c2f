"""
dataflow.py: draws the data flow of one LIMe layer, the Mermaid figure of docs/walkthrough.md, as a
PNG (assets/data_flow.png) that shows wherever Mermaid is not drawn: the notebook, Colab, a PDF.
The page's Mermaid block is the one source: its nodes, labels and arrows are read from it, and
LAYOUT here places each node. After an edit of the figure, draw it again (with matplotlib):

    python -m lab.dataflow

The PNG records the hash of the Mermaid it was drawn from; tests/test_walkthrough.py fails while
the two differ.
"""
import hashlib
import re

from configurator import configure, fail, read_text
from lab import plot

# -----------------------------------------------------------------------------
page = 'docs/walkthrough.md'  # holds the figure, one ```mermaid block
out = 'assets/data_flow.png'  # what it draws
# -----------------------------------------------------------------------------
# Where each node goes: (column, row), rows top down. A node the figure gains needs a place here.
LAYOUT = {'x': (1.6, 0), 'h': (1.6, 1), 'q': (0, 2.2), 'kv': (1.95, 2.2), 'earlier': (4.25, 2.2),
          'memory': (3.5, 3.6), 'later': (0.95, 3.6), 'static': (1.8, 5.0), 'dynamic': (5.0, 5.0),
          'routed': (3.4, 6.3), 'attn': (1.1, 7.5), 'cache': (5.0, 7.5), 'out': (1.1, 8.7)}
# Arrows that would cross a box bend round it instead: matplotlib's arc3 connection, rad its bend.
BENDS = {('h', 'dynamic'): -0.65}
NODE = r'(\w+)(?:\[\("(.*?)"\)\]|\["(.*?)"\])?'  # id, then ["box"] or [("store")] where defined
ARROW = r'\s*(-->|-\.->)(?:\|"?(.*?)"?\|)?\s*'  # solid or dotted, with an optional |label|
LINE = re.compile(rf'^\s*{NODE}{ARROW}{NODE}\s*$')


def mermaid(text):
    """The page's one Mermaid block, or one line saying it has none or several."""
    blocks = re.findall(r'^```mermaid\n(.*?)^```', text, re.M | re.S)
    if len(blocks) != 1:
        fail(f"{page} holds {len(blocks)} Mermaid blocks; the figure is the one")
    return blocks[0]


def source_hash(figure):
    return hashlib.sha256(figure.encode()).hexdigest()


def parse(figure):
    """(nodes {id: (label, kind)}, edges [(source, target, label, dotted)]) of a Mermaid flowchart
    written as the page writes it: one arrow a line, a node's label where it first appears."""
    nodes, edges = {}, []
    lines = figure.strip().splitlines()
    if not lines or lines[0].strip() != 'flowchart TB':
        fail(f"{page}: the figure must open with `flowchart TB`")
    for number, line in enumerate(lines[1:], 2):
        found = LINE.match(line)
        if found is None:
            fail(f"{page}, the figure's line {number}: not `a -->|label| b` ({line.strip()})")
        source, source_store, source_box, arrow, label, target, target_store, target_box = \
            found.groups()
        for node, store, box in ((source, source_store, source_box),
                                 (target, target_store, target_box)):
            if store is not None or box is not None:
                nodes[node] = ((store or box).replace('<br/>', '\n'),
                               'store' if store is not None else 'box')
        edges.append((source, target, (label or '').replace('<br/>', '\n'), arrow == '-.->'))
    unplaced = sorted({n for edge in edges for n in edge[:2]} - set(LAYOUT))
    if unplaced:
        fail(f"the figure has nodes LAYOUT in lab/dataflow.py does not place: {unplaced}")
    return nodes, edges


def halfway(ax, start, end, bend):
    """The middle of an arc3 arrow from start to end (data coordinates): matplotlib bends it in
    the display's coordinates, through a control point bend times the chord to its side."""
    (x0, y0), (x1, y1) = ax.transData.transform([start, end])
    control = ((x0 + x1) / 2 + bend * (y1 - y0), (y0 + y1) / 2 - bend * (x1 - x0))
    middle = [(a + 2 * c + b) / 4 for a, c, b in zip((x0, y0), control, (x1, y1))]  # t = 1/2
    return ax.transData.inverted().transform(middle)


def draw(nodes, edges):
    """The figure: boxes for tensors, rounded boxes for what is kept (the memory, the cache)."""
    fig, ax = plot.plt.subplots(figsize=(10, 10.5))
    ax.set_xlim(-1.0, 7.0)
    ax.set_ylim(9.2, -0.6)  # rows top down
    ax.axis('off')
    style = {'box': dict(boxstyle='square,pad=0.45', facecolor='#eef3fb', edgecolor='#4a6fa5'),
             'store': dict(boxstyle='round,pad=0.55,rounding_size=0.9', facecolor='#fdf3dc',
                           edgecolor='#b8862b')}
    texts = {}
    for node, (col, row) in LAYOUT.items():
        label, kind = nodes.get(node, (node, 'box'))  # a node named only: its id is its label
        texts[node] = ax.text(col, row, label, ha='center', va='center', fontsize=9.5,
                              bbox=style[kind], zorder=2)
    fig.tight_layout()  # now, not when saved: the labels' places below depend on it
    for source, target, label, dotted in edges:
        bend = BENDS.get((source, target), 0.0)
        ax.annotate('', xy=LAYOUT[target], xytext=LAYOUT[source], zorder=1,
                    arrowprops=dict(arrowstyle='-|>', color='#555555', lw=1.2,
                                    linestyle=(0, (4, 3)) if dotted else '-',
                                    connectionstyle=f'arc3,rad={bend}',
                                    patchA=texts[source].get_bbox_patch(),
                                    patchB=texts[target].get_bbox_patch()))
        if label:
            ax.text(*halfway(ax, LAYOUT[source], LAYOUT[target], bend), label, ha='center',
                    va='center', fontsize=8.5, color='#333333', zorder=3,
                    bbox=dict(boxstyle='round,pad=0.15', facecolor='white', edgecolor='none'))
    ax.set_title("Layer l's attention in a LIMe model (dotted: the layer memory across layers, "
                 "the dynamic router's input, the cache)", fontsize=10)
    return fig


def main():
    config, _, _ = configure(globals(), {'path': ['page', 'out']})
    if plot.plt is None:
        fail("drawing the figure needs matplotlib: pip install matplotlib")
    figure = mermaid(read_text(config['page'], 'the walkthrough'))
    fig = draw(*parse(figure))
    plot.save(fig, config['out'], dpi=100, metadata={
        'Description': f"lab/dataflow.py from {config['page']}'s Mermaid figure, "
                       f"sha256 {source_hash(figure)}"})


if __name__ == '__main__':
    main()
