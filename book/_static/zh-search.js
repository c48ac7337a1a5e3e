/* 中文搜索：Sphinx 建索引时用 jieba 分词（“前缀缓存” → “前缀”“缓存”），但浏览器里的 splitQuery 不会分中文，
 * 整句“向上取整”在索引里找不到。这里先按 Sphinx 的默认规则切，再把含汉字的片段按索引里已有的词做正向最大匹配；
 * 匹配不上的单字丢掉（建索引时单字本来就被过滤了）。在 searchtools.js 之前加载，所以它的默认 splitQuery 不会覆盖这个。 */
var splitQuery = function (query) {
  var parts = query.split(/[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/gu).filter(function (t) { return t; });
  var index = (typeof Search !== "undefined" && Search._index) || null;
  if (!index) return parts;
  var has = function (w) {
    w = w.toLowerCase();
    return Object.prototype.hasOwnProperty.call(index.terms, w) ||
      Object.prototype.hasOwnProperty.call(index.titleterms, w);
  };
  var out = [];
  parts.forEach(function (part) {
    if (!/\p{Script=Han}/u.test(part) || has(part)) { out.push(part); return; }
    var i = 0;
    while (i < part.length) {
      var j = Math.min(part.length, i + 8);
      for (; j > i + 1; j--) if (has(part.slice(i, j))) break;
      var word = part.slice(i, j);
      if (j > i + 1 || /[A-Za-z0-9_]/.test(word)) out.push(word);
      i = j;
    }
  });
  return out.length ? out : parts;
};
