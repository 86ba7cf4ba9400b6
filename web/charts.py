"""The pages' chart helpers (browser JavaScript over plotly.js, which hfai-web serves from the
installed wheel: :mod:`hfai.web.assets`). Every chart has titled axes with units, a legend (or a
titled colour bar for a heat map), tooltips, and zoom on time that survives the next poll
(``uirevision``). Times arrive as Unix seconds and are drawn in UTC, as the rest of the pages show
them. Names in tooltips and legends are escaped: plotly renders a subset of HTML in text."""

from __future__ import annotations

CHARTS_JS = r"""
const PLOT_CONFIG={displaylogo:false, responsive:true, modeBarButtonsToRemove:['select2d','lasso2d']};
const ESC={'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'};
function esc(s){return String(s).replace(/[&<>"']/g,c=>ESC[c]);}
function ms(ts){return ts*1000;}
function chartsMissing(div){if(typeof Plotly!=='undefined') return false;
  div.textContent='charts unavailable: the plotly package is missing on the hfai-web host'; return true;}
function baseLayout(title, extra){return Object.assign({title:{text:esc(title), x:0, xanchor:'left', font:{size:14}},
  uirevision:'keep', font:{family:'system-ui,sans-serif', size:12}, margin:{l:78, r:8, t:40, b:50},
  hovermode:'closest', paper_bgcolor:'#fff', plot_bgcolor:'#fafafa',
  legend:{orientation:'v', x:1.01, y:1, yanchor:'top'}}, extra||{});}
function timeAxis(t0, t1, extra){return Object.assign({type:'date', title:{text:'time (UTC)'},
  range:(t0&&t1)?[ms(t0),ms(t1)]:undefined, showgrid:true}, extra||{});}
// plotly's toolbar sits at the top right, over the title's line: a title that would run under it
// goes on more lines (the top margin and the chart grow by the lines added).
const TITLE_FONT='14px system-ui,sans-serif', TITLE_LINE_PX=18, MODEBAR_PX=200;
let measure=null;
function textPx(text){measure=measure||document.createElement('canvas').getContext('2d');
  measure.font=TITLE_FONT; return measure.measureText(text).width;}
function fitTitle(div, layout){const t=layout.title; if(!t||!t.text||!div.clientWidth) return;
  const bar=div.querySelector('.modebar'), barPx=bar&&bar.getBoundingClientRect().width||MODEBAR_PX;
  const room=div.clientWidth-barPx-24, lines=[];
  for(const word of t.text.split(' ')){const last=lines.length-1;
    if(last>=0 && textPx(lines[last]+' '+word)<=room) lines[last]+=' '+word; else lines.push(word);}
  if(lines.length<2) return;
  t.text=lines.join('<br>');
  const more=(lines.length-1)*TITLE_LINE_PX;
  layout.margin=Object.assign({}, layout.margin, {t:(layout.margin&&layout.margin.t||40)+more});
  if(layout.height) layout.height+=more;}
function draw(div, traces, layout){fitTitle(div, layout); Plotly.react(div, traces, layout, PLOT_CONFIG);}
// Ticks at whole numbers for counts (nodes, jobs): plotly picks 0.5 steps for a range of 1 or 2.
function countTicks(hi){const raw=Math.max(1,hi)/6, mag=10**Math.floor(Math.log10(raw));
  return {tick0:0, dtick:Math.max(1, [1,2,5,10].map(m=>m*mag).find(step=>step>=raw))};}
function nothing(layout, text){layout.annotations=[{text:esc(text), showarrow:false, xref:'paper', yref:'paper',
  x:0.5, y:0.5, font:{size:13, color:'#777'}}]; return layout;}

// lines: [{name, ts:[..], v:[..], colour?, dash?}] on one value axis.
function lineChart(div, title, lines, yTitle, opts){if(chartsMissing(div)) return; opts=opts||{};
  // Few points: markers too, or a short run would draw nothing.
  const traces=lines.map(l=>({type:'scatter', mode:l.v.length<30?'lines+markers':'lines', name:esc(l.name),
    x:l.ts.map(ms),
    y:l.v, connectgaps:false, line:{width:1.5, color:l.colour, dash:l.dash},
    hovertemplate:esc(l.name)+': %{y:.1f}'+(opts.unit||'')+'<br>%{x|%H:%M:%S} UTC<extra></extra>'}));
  const layout=baseLayout(title, {height:opts.height||260, showlegend:true,
    xaxis:timeAxis(opts.t0, opts.t1), yaxis:{title:{text:yTitle}, range:opts.yRange, rangemode:'tozero'}});
  if(!lines.some(l=>l.v.length)) nothing(layout, opts.empty||'no figures in this window');
  draw(div, traces, layout);}

// panels: [{title (the y axis), unit, lines:[{name, ts, v, colour?}], range?, counts?}] stacked on one
// time axis; ``counts``: the values are whole numbers (ticks at whole numbers only).
function stackedChart(div, title, panels, opts){if(chartsMissing(div)) return; opts=opts||{};
  const n=panels.length, gap=0.08, h=(1-gap*(n-1))/n, traces=[], layout=baseLayout(title,
    {height:opts.height||120+150*n, showlegend:true, xaxis:timeAxis(opts.t0, opts.t1, {anchor:'y'+(n>1?n:'')})});
  panels.forEach((p,i)=>{const ax=i?'y'+(i+1):'y', key=i?'yaxis'+(i+1):'yaxis', lo=1-(i+1)*h-i*gap;
    layout[key]={title:{text:p.title}, domain:[Math.max(0,lo), lo+h], range:p.range, rangemode:'tozero'};
    if(p.counts) Object.assign(layout[key], countTicks(p.range?p.range[1]:Math.max(0, ...p.lines.flatMap(l=>l.v))));
    for(const l of p.lines) traces.push({type:'scatter', mode:'lines', name:esc(l.name), x:l.ts.map(ms), y:l.v,
      yaxis:ax, line:{width:1.8, color:l.colour, shape:l.shape||'linear'},
      hovertemplate:esc(l.name)+': %{y:.1f}'+(p.unit||'')+'<br>%{x|%H:%M:%S} UTC<extra></extra>'});});
  draw(div, traces, layout);}

// Stacked bars: one trace per series over categories (e.g. GPU-hours per day, one colour per user).
function barChart(div, title, cats, series, yTitle, xTitle){if(chartsMissing(div)) return;
  const traces=series.map(s=>({type:'bar', name:esc(s.name), x:cats, y:s.v,
    hovertemplate:esc(s.name)+' %{x}: %{y:.2f} '+esc(yTitle)+'<extra></extra>'}));
  const layout=baseLayout(title, {barmode:'stack', height:300, showlegend:true,
    xaxis:{type:'category', title:{text:xTitle}}, yaxis:{title:{text:yTitle}, rangemode:'tozero'}});
  if(!cats.length) nothing(layout, 'no GPU-hours in this window');
  draw(div, traces, layout);}

function rowHeight(rows){return rows>64?7:rows>32?10:rows>12?14:24;}

// A nodes × time heat map: hm={x:[ts..], nodes:[..], <field>:[[..]..]}.
function heatMap(div, title, hm, field, barTitle){if(chartsMissing(div)) return;
  const rows=hm.nodes.length;
  const trace={type:'heatmap', x:hm.x.map(ms), y:hm.nodes, z:hm[field], zmin:0, zmax:100, colorscale:'Viridis',
    hoverongaps:false, colorbar:{title:{text:barTitle, side:'right'}, ticksuffix:'%', thickness:12},
    hovertemplate:'%{y}<br>%{x|%H:%M} UTC<br>'+esc(barTitle)+': %{z:.0f}%<extra></extra>'};
  const layout=baseLayout(title, {height:130+Math.max(rows,3)*rowHeight(rows), margin:{l:78, r:24, t:40, b:50},
    xaxis:timeAxis(hm.x.length?hm.x[0]-30:0, hm.x.length?hm.x[hm.x.length-1]+30:0),
    yaxis:{title:{text:'node'}, type:'category', autorange:'reversed', automargin:true}});
  if(!rows) nothing(layout, 'no nodes');
  draw(div, [trace], layout);}

const MARK_STYLE={'preempted':{symbol:'x', colour:'#c00'}, 'time slice':{symbol:'diamond', colour:'#c60'},
  'interrupted':{symbol:'triangle-down', colour:'#a0a'}, 'suspend acknowledged':{symbol:'circle', colour:'#060'},
  'stopped unacknowledged':{symbol:'square', colour:'#000'}, 'resumed':{symbol:'triangle-right', colour:'#06c'}};

// The time-sharing timeline: tl = web/timeline.py's Timeline.as_json().
function gantt(div, title, tl, opts){if(chartsMissing(div)) return; opts=opts||{};
  const jobs=Object.fromEntries(tl.jobs.map(j=>[j.id,j])), traces=[];
  for(const j of tl.jobs){const segs=tl.segments.filter(s=>s.job===j.id), y=[], base=[], x=[], text=[];
    for(const s of segs) for(const n of s.nodes){y.push(n); base.push(ms(s.start)); x.push(ms(s.end)-ms(s.start));
      text.push(`${esc(j.name)} (${esc(j.id)}, ${esc(j.user)})<br>run ${s.run} on ${esc(n)}<br>`+
        `${when(s.start)} → ${s.ongoing?'now':when(s.end)}`);}
    if(!y.length) continue;
    traces.push({type:'bar', orientation:'h', name:esc(j.name)+' ('+esc(j.id)+')', legendgroup:'jobs',
      legendgrouptitle:{text:'jobs'}, y, base, x, text, textposition:'none', hovertemplate:'%{text}<extra></extra>',
      marker:{color:j.colour, line:{width:0}}, width:0.8});}
  for(const kind of tl.kinds){const style=MARK_STYLE[kind]||{symbol:'circle', colour:'#333'}, x=[], y=[], text=[];
    for(const m of tl.marks.filter(m=>m.kind===kind)) for(const n of m.nodes){x.push(ms(m.ts)); y.push(n);
      const j=jobs[m.job]; text.push(`${esc(kind)}: ${esc(j?j.name:m.job)} (${esc(m.job)}) on ${esc(n)}<br>`+
        `${when(m.ts)}<br>${esc(m.reason)}`);}
    if(!x.length && !opts.allKinds) continue;
    traces.push({type:'scatter', mode:'markers', name:esc(kind), legendgroup:'marks', legendgrouptitle:{text:'events'},
      x, y, text, hovertemplate:'%{text}<extra></extra>',
      marker:{symbol:style.symbol, color:style.colour, size:10, line:{width:1.5, color:'#fff'}}});}
  const rows=tl.nodes.length, legendPx=140+26*traces.length;  // the legend is beside the chart: room for it
  const layout=baseLayout(title, {barmode:'overlay', height:Math.max(150+Math.max(rows,2)*rowHeight(rows), legendPx),
    xaxis:timeAxis(tl.t0, tl.t1), yaxis:{title:{text:'node'}, type:'category', categoryorder:'array',
    categoryarray:tl.nodes, autorange:'reversed', automargin:true}, showlegend:true,
    legend:{orientation:'v', x:1.01, y:1, yanchor:'top', groupclick:'toggleitem'}, margin:{l:78, r:8, t:40, b:50}});
  if(!traces.length){traces.push({type:'scatter', mode:'markers', x:[], y:[], name:'no jobs'});
    nothing(layout, 'no job held a node in this window');}
  draw(div, traces, layout);}
"""
